"""The local search after the design (issue 41): edge probes along ordered knobs, a trust region.

The line and probe logic on a command-engine space; then ``bo`` on real Optuna studies told
through :func:`autotune.record.optuna_study.tell` (the driver's path): a speed that rises with
a memory knob up to a crash edge, where the local turns bisect toward the edge.
"""

from __future__ import annotations

import optuna
import pytest

from autotune.config.schema import load_config
from autotune.config.validate import compile_space
from autotune.record import optuna_study as studylib
from autotune.search import design
from autotune.search import local
from autotune.search.bo import PoolSampler
from autotune.search.design import startup_design
from autotune.search.pool import build_pool
from autotune.trial.spec import TrialResult

EDGE_AT = 26  # the largest ``mem`` that runs


def _config(constraints=()):
    return load_config({
        "engine": {"kind": "command", "settings": {
            "argv": ["x", "{mem}"],
            "knobs": {"mem": {"type": "int", "low": 0, "high": 40},
                      "mode": {"type": "str", "choices": ["x", "y", "z"]},
                      "batch": {"type": "int", "low": 1, "high": 8}},
            "defaults": {"mem": 0, "mode": "x", "batch": 1}}},
        "space": {"mem": {"type": "int", "low": 0, "high": 40, "step": 2},
                  "mode": {"type": "categorical", "choices": ["x", "y", "z"]},
                  "batch": {"type": "categorical", "choices": [1, 2, 4, 8]}},
        "objectives": ["decode_tps"],
        "constraints": list(constraints),
        "quality": {"enabled": False},
    })


def _run(p: dict, number: int) -> TrialResult:
    """Speed rises with ``mem`` up to EDGE_AT, past which the launch runs out of memory."""
    if p["mem"] > EDGE_AT:
        return TrialResult(number, "oom", reason="out of memory")
    tps = 10.0 + p["mem"] + {"x": 0.0, "y": 1.0, "z": -1.0}[p["mode"]] + 0.1 * p["batch"]
    return TrialResult(number, "ok", {"decode_tps": tps})


@pytest.fixture
def edge_on(monkeypatch):
    monkeypatch.setattr(local, "EDGE", True)
    monkeypatch.setattr(local, "EVERY", 1)


def test_ordered_knobs_are_numbers_and_declared_orders():
    space = compile_space(_config())
    assert [p.name for p in local.ordered_knobs(space)] == ["mem", "batch"]  # mode has no order


def test_a_line_moves_one_knob_and_holds_the_others():
    space = compile_space(_config())
    centre = {"mem": 10, "mode": "y", "batch": 2}
    mem = local.line(space, centre, space.params["mem"])
    assert [c["mem"] for c in mem] == list(range(0, 41, 2))
    assert all(c["mode"] == "y" and c["batch"] == 2 for c in mem)


def test_an_edge_probe_bisects_between_the_best_point_and_the_first_bad_value():
    """Measured feasible at 10, out of memory at 40, the rest unknown but predicted feasible:
    the probe is the untried value halfway (26 of 10..40 on steps of 2); with a measured
    failure next to the centre the edge is pinned and nothing is probed that way."""
    space = compile_space(_config())
    centre = {"mem": 10, "mode": "x", "batch": 1}

    def know(c):
        if c == centre:
            return local.Known(True, 1.0, 1.0)
        if c["mem"] == 40 and c["batch"] == 1:
            return local.Known(True, None, 2.0)
        return local.Known(False, None, 1.5, 0.9)

    probes = local.edge_probes(space, centre, -10.0, know)
    assert {"mem": 24, "mode": "x", "batch": 1} in probes or {"mem": 26, "mode": "x", "batch": 1} in probes
    assert all(p["mode"] == "x" for p in probes)

    def pinned(c):
        if c["mem"] == 12:
            return local.Known(True, None, 2.0)
        return know(c)

    assert not [p for p in local.edge_probes(space, centre, -10.0, pinned) if p["mem"] > 10]


def test_a_cliff_counts_as_an_edge_and_a_predicted_failure_too():
    space = compile_space(_config())
    centre = {"mem": 20, "mode": "x", "batch": 1}

    def spill(c):  # 32 and up ran, ten times slower (a spill): past the edge
        if c["mem"] >= 32 and c["batch"] == 1:
            return local.Known(True, -2.0, -2.0)
        return local.Known(c == centre, 1.0 if c == centre else None, 1.0, 0.9)

    assert {"mem": 26, "mode": "x", "batch": 1} in local.edge_probes(space, centre, 1.0 - 0.7, spill)

    def predicted(c):  # nothing measured past the centre, predicted to fail from 28 on
        return local.Known(c == centre, 1.0 if c == centre else None, 1.0, 0.1 if c["mem"] >= 28 else 0.9)

    assert {"mem": 24, "mode": "x", "batch": 1} in local.edge_probes(space, centre, -10.0, predicted)


def _study(cfg, space, seed=0):
    sampler = PoolSampler(space, lambda: build_pool(space, lambda p: (True, None), seed), cfg.constraints,
                          seed, 3, objectives=studylib.told_names(cfg))
    return optuna.create_study(directions=studylib.directions(cfg), sampler=sampler)


def _measure(study, cfg, space, params=None):
    if params is not None:
        study.enqueue_trial({k: v for k, v in params.items()})
    trial = study.ask()
    p = space.suggest(trial)
    studylib.tell(study, trial, cfg, p, _run(p, trial.number))
    return p


def test_bo_bisects_toward_the_crash_edge_and_pins_it(edge_on):
    """Startup at mem 0, 4 and 10 (mode y) and 40 (out of memory): every local turn moves along
    the best point's line (mode y, batch 1 held) between it and the predicted or measured
    crash, and the edge itself (26) is measured within four model asks."""
    cfg = _config()
    space = compile_space(cfg)
    study = _study(cfg, space)
    for p in ({"mem": 0, "mode": "x", "batch": 1}, {"mem": 10, "mode": "y", "batch": 1},
              {"mem": 40, "mode": "z", "batch": 8}, {"mem": 4, "mode": "y", "batch": 1}):
        _measure(study, cfg, space, p)
    asked = [_measure(study, cfg, space) for _ in range(4)]
    assert all(p["mode"] == "y" and p["batch"] == 1 and 10 < p["mem"] < 40 for p in asked), asked
    assert EDGE_AT in [p["mem"] for p in asked]


def test_a_trust_region_turn_stays_near_the_best_points(monkeypatch):
    """Each trust-region turn proposes within TRUST_RADIUS of one of the two best feasible
    points: the same mode (a changed choice is 1.41 away), mem within 0.6 of its range."""
    monkeypatch.setattr(local, "TRUST", True)
    monkeypatch.setattr(local, "EVERY", 1)
    cfg = _config()
    space = compile_space(cfg)
    study = _study(cfg, space)
    seen = []
    for p in ({"mem": 0, "mode": "x", "batch": 1}, {"mem": 20, "mode": "y", "batch": 1},
              {"mem": 40, "mode": "z", "batch": 8}):
        seen.append((_measure(study, cfg, space, p), _run(p, 0).status == "ok"))
    for _ in range(3):
        ok = [p for p, fine in seen if fine]
        best = sorted(ok, key=lambda p: -_run(p, 0).metrics["decode_tps"])[: local.CENTRES]
        p = _measure(study, cfg, space)
        assert any(p["mode"] == b["mode"] and abs(p["mem"] - b["mem"]) <= 0.6 * 40 for b in best), (p, best)
        seen.append((p, p["mem"] <= EDGE_AT))


@pytest.mark.parametrize("constraints", [(), ("decode_tps >= 1000",)])
def test_a_lazy_cover_keeps_the_design_short_and_shows_every_level_by_the_model(monkeypatch, constraints):
    """Without a prior a lazy cover does not lengthen the design (a 1-point design shows one
    missing level, not two); bo shows the level still missing on its first model ask, also
    while nothing measured is feasible (a bound no configuration meets)."""
    cfg = _config(constraints)
    space = compile_space(cfg)
    base = {"mem": 0, "mode": "x", "batch": 1}
    always = lambda p: (True, None)  # noqa: E731
    assert len(startup_design(space, 1, 0, [base], always)) == 2  # eager: both missing modes
    monkeypatch.setattr(design, "COVER_LAZY", True)
    assert len(startup_design(space, 1, 0, [base], always)) == 2  # tpe, gp: no lazy turns, eager
    short = startup_design(space, 1, 0, [base], always, lazy=True)
    assert len(short) == 1
    study = _study(cfg, space)
    for p in (base, *short, {"mem": 20, "mode": short[0]["mode"], "batch": 2}):
        _measure(study, cfg, space, p)
    shown = {base["mode"], short[0]["mode"]}
    assert _measure(study, cfg, space)["mode"] not in shown
