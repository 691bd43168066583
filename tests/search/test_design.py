"""The startup design: space-filling, valid under rules and `when`, distinct, ordered by prediction.

Built on the real ``local_cpu`` space (llama.cpp knobs, its two rules) and a command-engine
space with a conditional parameter; no trial runs.
"""

from __future__ import annotations

import io
import math

import pytest
from rich.console import Console

from autotune.config.compose import compose
from autotune.config.schema import load_config
from autotune.config.validate import compile_space
from autotune.engines.base import Knob
from autotune.output.report import Reporter
from autotune.run.driver import Driver
from autotune.search.design import FAST_PART
from autotune.search.design import FAST_SHARE
from autotune.search.design import NO_PRIOR_STARTUP
from autotune.search.design import _pool
from autotune.search.design import config_key
from autotune.search.design import default_n_startup
from autotune.search.design import from_unit
from autotune.search.design import startup_design
from autotune.search.space import baseline_params
from autotune.search.space import compile_param


def _space(*overrides: str):
    cfg = load_config(compose(["conf=local_cpu", *overrides]))
    return cfg, compile_space(cfg)


def _always(params):
    return True, None


def test_design_is_valid_distinct_and_avoids_what_is_queued():
    cfg, space = _space("space.n_threads.high=2", "space.n_threads_batch.high=2")
    base = baseline_params(space, cfg.engine.variants)
    design = startup_design(space, 7, 0, [base], _always)
    assert len(design) == 7
    keys = [config_key(p) for p in design]
    assert len(set(keys)) == 7 and config_key(base) not in keys
    for p in design:
        assert space.violations(p) == [], p  # no rule-breaking point (n_ubatch <= n_batch, V cache)
        assert set(p) == set(space.params)
    # space-filling: every model variant and both flash_attn values show up in 7 points
    assert len({p["model"] for p in design}) >= 4
    assert {p["flash_attn"] for p in design} == {False, True}


def test_design_is_deterministic_per_seed():
    _, space = _space()
    a = startup_design(space, 5, 3, [], _always)
    assert a == startup_design(space, 5, 3, [], _always)
    assert a != startup_design(space, 5, 4, [], _always)


def test_design_drops_points_predicted_not_to_fit_and_orders_by_predicted_speed():
    _, space = _space()

    def screen(p):  # a made-up engine estimate: q8_0 never fits; speed falls with n_ctx
        return p["model"] != "q8_0", 1e6 / p["n_ctx"] + p["n_threads"]

    design = startup_design(space, 6, 0, [], screen)
    assert len(design) == 6 and all(p["model"] != "q8_0" for p in design)
    bounds = [screen(p)[1] for p in design]
    assert bounds == sorted(bounds, reverse=True)
    # the design is spread over the fastest third of the valid, fitting configurations
    pool = sorted((screen(p)[1] for p in _pool(space, 0, set()) if screen(p)[0]), reverse=True)
    assert min(bounds) >= pool[int(len(pool) * FAST_SHARE) - 1]
    assert len({config_key(p) for p in design}) == 6


def test_design_respects_when_conditions():
    data = compose(["conf=command_example"])
    data["engine"]["settings"]["knobs"]["draft"] = {"type": "str", "choices": ["none", "ngram"]}
    data["engine"]["settings"]["defaults"]["draft"] = "none"
    data["space"] = {"draft": {"type": "categorical", "choices": ["none", "ngram"]},
                     "draft_k": {"type": "int", "low": 1, "high": 8, "when": "draft != 'none'"},
                     "skip_threshold": data["space"]["skip_threshold"]}
    data["engine"]["settings"]["knobs"]["draft_k"]["low"] = 0
    cfg = load_config(data)
    space = compile_space(cfg)
    design = startup_design(space, 6, 0, [], _always)
    assert len(design) == 6
    for p in design:
        assert ("draft_k" in p) == (p["draft"] != "none"), p


@pytest.mark.parametrize(("spec", "knob", "u", "want"), [
    ({"type": "int", "low": 1, "high": 4}, Knob("int", low=0, high=9), 0.0, 1),
    ({"type": "int", "low": 1, "high": 4}, Knob("int", low=0, high=9), 0.999, 4),
    ({"type": "int", "low": 64, "high": 4096, "log": True}, Knob("int", low=1, high=9999), 0.5, 512),
    ({"type": "float", "low": 0.95, "high": 1.0, "step": 0.0025}, Knob("float", low=0, high=1), 0.999, 1.0),
    ({"type": "float", "low": 0.0, "high": 2.0}, Knob("float", low=0, high=2), 0.25, 0.5),
    ({"type": "categorical", "choices": ["a", "b", "c"]}, Knob("str"), 0.5, "b"),
    ({"type": "bool"}, Knob("bool"), 0.7, True),
])
def test_from_unit(spec, knob, u, want):
    p = compile_param("k", spec, knob, "space.k", [], {})
    got = from_unit(p, u)
    assert got == want if not isinstance(want, float) else math.isclose(got, want)
    assert p.contains(got)


@pytest.mark.parametrize(("n_trials", "want"), [(1, 1), (5, 3), (12, 4), (16, 5), (20, 6), (30, 8), (100, 8)])
def test_default_n_startup(n_trials, want):
    assert default_n_startup(n_trials) == want


@pytest.mark.parametrize("sampler", ["tpe", "bo"])
def test_half_the_design_of_bo_spreads_beyond_the_fastest_predicted_third(sampler, gemma_path):
    """tpe/gp start among the fastest-predicted third; bo, whose model takes the bound as a prior
    with a fitted trust, starts half there and half over every fitting configuration (a design
    confined by the bound never shows where the bound is wrong)."""
    cfg, space = _space(f"study.sampler={sampler}", "study.n_trials=16", "study.seed=0")
    driver = Driver(cfg, space, None, None, Reporter(cfg, Console(file=io.StringIO())))
    base = baseline_params(space, cfg.engine.variants)
    design = driver.design(base)
    assert len(design) == default_n_startup(16) - 1
    bound = {config_key(p): driver._screen(p)[1] for p in _pool(space, 0, {config_key(base)})}
    ranked = sorted(bound.values(), reverse=True)
    cut = ranked[int(len(ranked) * FAST_SHARE) - 1]
    fast = [p for p in design if bound[config_key(p)] >= cut]
    assert len(fast) >= math.ceil(len(design) * FAST_PART[sampler])
    assert (len(fast) == len(design)) == (sampler == "tpe"), (sampler, len(fast))
    assert [bound[config_key(p)] for p in design] == sorted((bound[config_key(p)] for p in design), reverse=True)


@pytest.mark.parametrize(("conf", "overrides", "want"), [
    ("command_example", [], NO_PRIOR_STARTUP),  # no predict block: bo's model starts sooner
    ("command_example", ["study.sampler=tpe"], default_n_startup(20)),  # measured for bo only
    ("command_example", ["study.search=pareto"], default_n_startup(20)),
    ("command_example", ["study.n_startup=7"], 7),  # what the user sets wins
    # llama-server's bound (weights over RAM bandwidth) is the same for every parallel/threads
    ("serving_cpu", [], NO_PRIOR_STARTUP),
    ("local_cpu", [], default_n_startup(20)),  # its bound varies with the quantization
])
def test_bo_without_a_speed_prior_starts_its_model_sooner(conf, overrides, want):
    """With a speed bound (local_cpu) bo keeps the full design: the test above."""
    cfg = load_config(compose([f"conf={conf}", "study.n_trials=20", *overrides]))
    driver = Driver(cfg, compile_space(cfg), None, None, Reporter(cfg, Console(file=io.StringIO())))
    assert NO_PRIOR_STARTUP < default_n_startup(20)
    assert driver.n_startup() == want
    assert len(driver.design(baseline_params(driver.space, cfg.engine.variants))) == want - 1
