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
from autotune.search import design as design_mod
from autotune.search.design import FAST_PART
from autotune.search.design import FAST_SHARE
from autotune.search.design import NO_PRIOR_STARTUP
from autotune.search.design import _pool
from autotune.search.design import config_key
from autotune.search.design import cover_targets
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
def test_half_the_design_of_bo_spreads_beyond_the_fastest_predicted_third(sampler, gemma_path, monkeypatch):
    """tpe/gp start among the fastest-predicted third; bo, whose model takes the bound as a prior
    with a fitted trust, starts half there and half over every fitting configuration (a design
    confined by the bound never shows where the bound is wrong). The level coverage is off here
    (it adds a point per unshown level wherever the bound puts it: the tests below)."""
    monkeypatch.setattr(design_mod, "COVER", False)
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


def _branchy_space():
    """command_example with a three-way draft method (a conditional K) and a string knob."""
    data = compose(["conf=command_example"])
    knobs = data["engine"]["settings"]["knobs"]
    knobs["draft"] = {"type": "str", "choices": ["none", "ngram", "eagle"]}
    knobs["split"] = {"type": "str", "choices": ["auto", "tp", "30,22", "28,22", "32,24"]}
    knobs["draft_k"]["low"] = 0
    data["engine"]["settings"]["defaults"].update(draft="none", split="auto")
    data["space"] = {"draft": {"type": "categorical", "choices": ["none", "ngram", "eagle"]},
                     "draft_k": {"type": "int", "low": 1, "high": 8, "when": "draft != 'none'"},
                     "split": {"type": "categorical", "choices": ["auto", "tp", "30,22", "28,22", "32,24"]},
                     "skip_threshold": data["space"]["skip_threshold"]}
    return compile_space(load_config(data))


def test_cover_targets_are_unordered_levels_and_both_branches():
    targets = cover_targets(_branchy_space())
    names = {t[0] for t in targets}
    assert names == {"draft", "draft_k", "split"}  # skip_threshold is numeric: the model interpolates
    assert len([t for t in targets if t[0] == "split"]) == 5 and len([t for t in targets if t[0] == "draft_k"]) == 2


@pytest.mark.parametrize("n", [1, 3, 8])
def test_design_shows_every_level_and_branch_however_short(n):
    """Issue 41: a startup of 2 (trial 0 + 1) still shows each split, each draft method and K
    both active and inactive, each point valid; a longer one spreads the rest as before."""
    space = _branchy_space()
    base = {"draft": "none", "split": "auto", "skip_threshold": 1.0}
    design = startup_design(space, n, 0, [space.restrict(base)], _always)
    shown = [base, *design]
    assert {p["split"] for p in shown} == {"auto", "tp", "30,22", "28,22", "32,24"}
    assert {p["draft"] for p in shown} == {"none", "ngram", "eagle"}
    assert any("draft_k" in p for p in shown) and any("draft_k" not in p for p in shown)
    assert len(design) == max(n, 4)  # four points show the four unshown splits (and the drafts)
    assert all(space.violations(p) == [] for p in design)
    assert len({config_key(p) for p in shown}) == len(shown)


def test_a_misleading_prior_cannot_hide_a_level_only_an_engine_check_can():
    """A bound that calls eagle and tensor parallel the slowest still sees them measured; a
    level the engine predicts will not fit is not launched."""
    space = _branchy_space()

    def misleading(p):
        slow = (p["draft"] == "eagle") + (p["split"] == "tp")
        return True, 100.0 - 40 * slow + p.get("draft_k", 0)

    design = startup_design(space, 3, 0, [], misleading)
    assert {"eagle", "ngram", "none"} <= {p["draft"] for p in design}
    assert "tp" in {p["split"] for p in design}
    assert [misleading(p)[1] for p in design] == sorted((misleading(p)[1] for p in design), reverse=True)
    no_tp = startup_design(space, 3, 0, [], lambda p: (p["split"] != "tp", None))
    assert "tp" not in {p["split"] for p in no_tp} and len({p["split"] for p in no_tp}) == 4
