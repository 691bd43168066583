"""The search space: YAML parameter specs -> Optuna distributions, conditions, grid, baseline.

Table-first tests of :func:`autotune.search.space.compile_param`, then whole spaces compiled from
configs for real engines (llamacpp, command, exllamav2's GPU-memory check) and driven
through real Optuna studies (suggest, enqueue, grid).
"""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.distributions import FloatDistribution
from optuna.distributions import IntDistribution

from autotune.config.schema import load_config
from autotune.config.validate import compile_space
from autotune.engines.base import Knob
from autotune.errors import ConfigError
from autotune.record.optuna_study import enqueue_initial
from autotune.search.samplers import make_sampler
from autotune.search.space import baseline_params
from autotune.search.space import compile_param
from autotune.search.space import decode
from autotune.search.space import encode

INT = Knob("int", low=0, high=4096)
FLOAT = Knob("float", low=0.0, high=1.0)
LIST = Knob("list")

PARAMS = [
    # (spec, knob, distribution, values or None for continuous)
    ({"type": "int", "low": 1, "high": 4}, INT, IntDistribution(1, 4), [1, 2, 3, 4]),
    (
        {"type": "int", "low": 64, "high": 256, "step": 64},
        INT,
        IntDistribution(64, 256, step=64),
        [64, 128, 192, 256],
    ),
    (
        {"type": "int", "low": 1, "high": 8, "log": True},
        INT,
        IntDistribution(1, 8, log=True),
        list(range(1, 9)),
    ),
    ({"type": "float", "low": 0.5, "high": 1.0}, FLOAT, FloatDistribution(0.5, 1.0), None),
    (
        {"type": "float", "low": 0.01, "high": 1.0, "log": True},
        FLOAT,
        FloatDistribution(0.01, 1.0, log=True),
        None,
    ),
    (
        {"type": "float", "low": 0.9, "high": 1.0, "step": 0.025},
        FLOAT,
        FloatDistribution(0.9, 1.0, step=0.025),
        [0.9, 0.925, 0.95, 0.975, 1.0],
    ),
    (
        {"type": "float", "low": 0.0, "high": 0.3, "step": 0.1},
        FLOAT,
        FloatDistribution(0.0, 0.3, step=0.1),
        [0.0, 0.1, 0.2, 0.3],
    ),  # 0.1 + 0.2 == 0.3 here
    (
        {"type": "categorical", "choices": [64, 128]},
        INT,
        CategoricalDistribution([64, 128]),
        [64, 128],
    ),
    (
        {"type": "categorical", "choices": [[30, 22], [28, 24]]},
        LIST,
        CategoricalDistribution(["[30, 22]", "[28, 24]"]),
        [[30, 22], [28, 24]],
    ),
    ({"type": "bool"}, Knob("bool"), CategoricalDistribution([False, True]), [False, True]),
    ({"type": "fixed", "value": 7}, INT, None, [7]),
    (7, INT, None, [7]),  # a bare value is a fixed parameter
]


@pytest.mark.parametrize(
    ("spec", "knob", "dist", "values"), PARAMS, ids=[str(p[0]) for p in PARAMS]
)
def test_compile_param(spec, knob, dist, values):
    p = compile_param("x", spec, knob, "space.x", [], {})
    assert p.dist == dist
    assert p.values() == values
    for v in values or []:
        assert p.contains(v)


BAD_PARAMS = [
    ({"type": "int", "low": 1}, INT, "space.x.high", "needs low and high"),
    ({"type": "int", "low": 1.5, "high": 3}, INT, "space.x.low", "expected an integer"),
    ({"type": "int", "low": 1, "high": 10, "step": 4}, INT, "space.x.high", "use high: 9 or 13"),
    (
        {"type": "float", "low": 0.1, "high": 0.5, "step": 0.15},
        FLOAT,
        "space.x.high",
        "multiple of step",
    ),
    (
        {"type": "int", "low": 1, "high": 8, "log": True, "step": 2},
        INT,
        "space.x.step",
        "log scale",
    ),
    ({"type": "int", "low": 0, "high": 8, "log": "yes"}, INT, "space.x.log", "true or false"),
    ({"type": "int", "low": 0, "high": 9000}, INT, "space.x.high", "an int in [0, 4096]"),
    ({"type": "float", "low": 0, "high": 1}, INT, "space.x.type", "takes integers"),
    ({"type": "int", "low": 0, "high": 1}, Knob("str"), "space.x.type", "use categorical or bool"),
    ({"type": "bool"}, INT, "space.x.type", "not a bool"),
    ({"type": "categorical", "choices": []}, INT, "space.x.choices", "non-empty list"),
    ({"type": "categorical", "choices": [1, "1"]}, INT, "space.x.choices", "distinct"),
    ({"type": "categorical", "choices": [30, 22]}, LIST, "space.x.choices[0]", "a list"),
    ({"type": "categorical", "choices": [1], "low": 0}, INT, "space.x.low", "unknown key"),
    ({"type": "categorical", "choices": [1, 2], "ordered": "yes"}, INT, "space.x.ordered", "true or false"),
    ({"type": "fixed"}, INT, "space.x.value", "needs value"),
    ({"type": "flaot", "low": 0}, INT, "space.x.type", "Did you mean: float?"),
    ({"low": 0, "high": 3}, INT, "space.x.type", "got None; unknown parameter type"),
    (
        {"type": "int", "low": 0, "high": 2, "when": "y > 1"},
        INT,
        "space.x.when",
        "unknown parameter",
    ),
]


@pytest.mark.parametrize(
    ("spec", "knob", "path", "needle"), BAD_PARAMS, ids=[str(p[0]) for p in BAD_PARAMS]
)
def test_compile_param_errors(spec, knob, path, needle):
    with pytest.raises(ConfigError) as e:
        compile_param("x", spec, knob, "space.x", [], {})
    assert e.value.path == path
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "value", [1, 0.5, "q8_0", True, None, [30, 22], {"a": [1]}, "", "[x", "{not json}", "30,22"]
)
def test_encode_decode_round_trip(value):
    assert decode(encode(value)) == value


def command_config(space: dict, rules: list | None = None, **study) -> object:
    """A config for the command engine with knobs k (int), t (float), split (list), fast."""
    return load_config(
        {
            "engine": {
                "kind": "command",
                "settings": {
                    "argv": ["x", "{k}"],
                    "knobs": {
                        "k": {"type": "int", "low": 0, "high": 16},
                        "t": {"type": "float", "low": 0.5, "high": 1.0},
                        "split": {"type": "list"},
                        "fast": {"type": "bool"},
                    },
                    "defaults": {"k": 0, "t": 1.0, "split": [30, 22], "fast": False},
                },
            },
            "space": space,
            "rules": rules or [],
            "objectives": ["decode_tps"],
            "quality": {"enabled": False},
            "study": study,
        }
    )


SPACE = {
    "fast": {"type": "bool"},
    "k": {"type": "int", "low": 0, "high": 8, "step": 2, "when": "fast"},
    "t": {"type": "float", "low": 0.9, "high": 1.0, "step": 0.05},
    "split": {"type": "categorical", "choices": [[30, 22], [28, 24], [32, 20]]},
}


def test_conditional_space_through_optuna():
    cfg = command_config(SPACE)
    space = compile_space(cfg)
    assert space.size() == 2 * 5 * 3 * 3
    study = optuna.create_study(sampler=make_sampler("tpe", 0, space, 30))
    seen_inactive = seen_active = False
    for _ in range(30):
        trial = study.ask()
        params = space.suggest(trial)
        assert params["split"] in ([30, 22], [28, 24], [32, 20])  # lists come back as lists
        assert params["t"] in (0.9, 0.95, 1.0)  # rounded on the step
        if params["fast"]:
            assert params["k"] in (0, 2, 4, 6, 8)
            seen_active = True
        else:
            assert "k" not in params  # never suggested while its `when` is false
            seen_inactive = True
        study.tell(trial, float(sum(params["split"])) + params.get("k", 0))
    assert seen_active and seen_inactive


def test_configurations_are_restricted_and_complete():
    space = compile_space(command_config(SPACE))
    configs = {str(sorted(c.items())) for c in space.configurations()}
    # fast=False drops k: 1 * 3 * 3 configs; fast=True: 5 * 3 * 3
    assert len(configs) == 9 + 45
    assert space.restrict({"fast": False, "k": 4, "t": 1.0, "split": [28, 24]}) == {
        "fast": False,
        "t": 1.0,
        "split": [28, 24],
    }


def test_baseline_and_enqueue_with_list_values():
    cfg = command_config(SPACE, enqueue=[{"fast": True, "k": 4, "split": [32, 20]}])
    space = compile_space(cfg)
    baseline = baseline_params(space, {})
    assert baseline == {"fast": False, "t": 1.0, "split": [30, 22]}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    enqueue_initial(study, space, baseline, cfg.study.enqueue)
    first, second = (space.suggest(study.ask()) for _ in range(2))
    assert first == baseline
    assert second == {"fast": True, "k": 4, "t": 1.0, "split": [32, 20]}


def test_baseline_outside_space_is_an_error():
    with pytest.raises(ConfigError, match="default must be inside the space") as e:
        baseline_params(
            compile_space(command_config({"k": {"type": "int", "low": 1, "high": 4}})), {}
        )
    assert e.value.path == "space.k"


def test_grid_sampler_visits_every_configuration_once():
    space = compile_space(
        command_config(
            {
                "k": {"type": "int", "low": 0, "high": 4, "step": 2},
                "split": {"type": "categorical", "choices": [[30, 22], [28, 24]]},
                "fast": {"type": "fixed", "value": True},
            }
        )
    )
    grid = space.grid()
    assert grid == {"k": [0, 2, 4], "split": ["[30, 22]", "[28, 24]"]}
    study = optuna.create_study(sampler=make_sampler("grid", 0, space, 6))
    seen = []
    for _ in range(6):
        trial = study.ask()
        seen.append(space.suggest(trial))
        study.tell(trial, 1.0)
    assert sorted(map(str, seen)) == sorted(map(str, space.configurations()))
    assert all(p["fast"] is True for p in seen)


def test_continuous_size_and_grid_refusal():
    space = compile_space(command_config({"t": {"type": "float", "low": 0.5, "high": 1.0}}))
    assert math.isinf(space.size())
    with pytest.raises(ConfigError, match="needs a step"):
        space.grid()


def test_model_variants_are_a_categorical_over_names():
    cfg = load_config(
        {
            "engine": {
                "kind": "llamacpp",
                "settings": {"default_variant": "a"},
                "variants": {
                    "a": {"path": "/m/a.gguf", "bpw": 4.5},
                    "b": {"path": "/m/b.gguf", "bpw": 3.0},
                },
            },
            "space": {"model": {"type": "categorical", "choices": ["a", "b"]}},
            "objectives": ["decode_tps"],
        }
    )
    space = compile_space(cfg)
    assert space.params["model"].values() == ["a", "b"]
    assert baseline_params(space, cfg.engine.variants) == {"model": "a"}


def exl2_config(choices: list) -> object:
    return load_config(
        {
            "engine": {
                "kind": "exllamav2",
                "settings": {
                    "gpus": [
                        {"name": "RTX 5090", "memory_gb": 32},
                        {"name": "RTX 4090", "memory_gb": 24},
                    ]
                },
                "variants": {"m": {"path": "/models/m", "bpw": 4.0}},
            },
            "space": {"gpu_split": {"type": "categorical", "choices": choices}},
            "objectives": ["decode_tps"],
        }
    )


def test_gpu_split_choice_checked_against_gpu_memory():
    space = compile_space(exl2_config(["auto", "tp", "30,22"]))
    assert space.params["gpu_split"].values() == ["auto", "tp", "30,22"]
    with pytest.raises(ConfigError) as e:
        compile_space(exl2_config(["auto", "30,26"]))
    assert e.value.path == "space.gpu_split.choices[1]"
    assert "RTX 4090" in str(e.value) and "24 GB" in str(e.value)


def test_rule_that_never_holds_fails_at_load():
    with pytest.raises(ConfigError, match="never holds") as e:
        compile_space(command_config({"k": {"type": "int", "low": 0, "high": 4}}, rules=["k > 4"]))
    assert e.value.path == "rules[0]"


def test_violations_report_rule_reasons():
    space = compile_space(
        command_config(
            SPACE, rules=[{"when": "fast", "require": "k <= split[1] / 4", "reason": "k too big"}]
        )
    )
    assert space.violations({"fast": True, "k": 8, "t": 1.0, "split": [30, 22]}) == ["k too big"]
    assert space.violations({"fast": True, "k": 4, "t": 1.0, "split": [30, 22]}) == []
    assert space.violations({"fast": False, "t": 1.0, "split": [30, 22]}) == []


def test_enqueued_inactive_parameter_is_an_error():
    from autotune.config.validate import validate_all

    cfg = command_config(SPACE, enqueue=[{"k": 4}])
    space = compile_space(cfg)
    with pytest.raises(ConfigError, match="inactive in this configuration") as e:
        validate_all(cfg, space, baseline_params(space, {}))
    assert e.value.path == "study.enqueue[0].k"


@pytest.mark.parametrize("name", ["tpe", "gp", "nsga2", "random"])
def test_every_sampler_drives_a_conditional_constrained_study(name):
    """Each sampler, as built from config, runs ask/tell with constraints on this space."""
    if name == "gp":
        pytest.importorskip("torch")
    space = compile_space(command_config(SPACE))
    study = optuna.create_study(
        directions=["maximize", "minimize"], sampler=make_sampler(name, 0, space, 12)
    )
    enqueue_initial(study, space, baseline_params(space, {}), [])
    for i in range(12):
        trial = study.ask()
        params = space.suggest(trial)
        assert all(space.params[k].contains(v) for k, v in params.items())
        trial.set_constraint("run_ok", 0.0 if i % 4 else 1.0)
        study.tell(trial, [float(params.get("k", 0)), params["t"]])
    assert len(study.trials) == 12


def test_gpu_split_checked_in_a_space_too_big_to_enumerate():
    cfg = exl2_config(["auto", "30,26"])
    big = {**cfg.space, "max_seq_len": {"type": "int", "low": 256, "high": 1 << 20}}
    from dataclasses import replace

    with pytest.raises(ConfigError, match=r"\(100 sampled\) with this value can run") as e:
        compile_space(replace(cfg, space=big))
    assert e.value.path == "space.gpu_split.choices[1]"
