"""``bo``'s Pareto search (``study.search: pareto``, two objectives): exact EHVI over the pool.

The EHVI is checked against a Monte-Carlo estimate; a real Optuna study told through
:func:`autotune.record.optuna_study.tell` (the driver's own path) on a command-engine space with a
rule and a constraint must find the true feasible front, whose hypervolume is known.
"""

from __future__ import annotations

import itertools

import numpy as np
import optuna
import pytest

from autotune.config.schema import load_config
from autotune.config.validate import compile_space
from autotune.record import optuna_study as studylib
from autotune.search.bo import PoolSampler
from autotune.search.design import config_key
from autotune.search.front import log_ehvi
from autotune.search.front import nondominated
from autotune.search.front import reference
from autotune.search.pool import build_pool
from autotune.trial.spec import TrialResult


def _hv(points: np.ndarray, ref: np.ndarray) -> float:
    """2-D hypervolume (both maximised) by brute force over the grid of coordinates."""
    pts = points[np.all(points > ref, axis=1)]
    if not len(pts):
        return 0.0
    xs, ys = np.unique(np.r_[ref[0], pts[:, 0]]), np.unique(np.r_[ref[1], pts[:, 1]])
    area = 0.0
    for (x0, x1), (y0, y1) in itertools.product(zip(xs, xs[1:]), zip(ys, ys[1:])):
        if np.any((pts[:, 0] >= x1) & (pts[:, 1] >= y1)):
            area += (x1 - x0) * (y1 - y0)
    return area


@pytest.mark.parametrize(("mu", "sd"), [((2.5, 2.5), (0.5, 0.5)), ((4.0, 0.5), (1.0, 0.2)),
                                        ((1.5, 3.5), (0.3, 0.8)), ((0.2, 0.2), (2.0, 2.0))])
def test_ehvi_equals_the_monte_carlo_mean_of_the_hypervolume_gain(mu, sd):
    front, ref = np.array([[3.0, 1.0], [2.0, 2.0], [1.0, 3.0], [1.5, 1.5]]), np.array([0.0, 0.0])
    base = _hv(front, ref)
    draws = np.random.default_rng(0).normal(mu, sd, size=(4000, 2))
    gains = np.array([_hv(np.vstack([front, p]), ref) - base for p in draws])
    exact = float(np.exp(log_ehvi(np.array([mu]), np.array([sd]), front, ref))[0])
    assert gains.mean() > 0.05
    assert abs(exact - gains.mean()) < 4 * gains.std() / np.sqrt(len(gains))  # within 4 standard errors


def test_ehvi_ranks_candidates_far_behind_the_front_by_how_far():
    front, ref = np.array([[3.0, 3.0]]), np.array([0.0, 0.0])
    mu = np.array([[0.0, 0.0], [-1.0, -1.0], [-3.0, -3.0]])
    out = log_ehvi(mu, np.full((3, 2), 0.3), front, ref)
    assert np.all(np.isfinite(out)) and out[0] > out[1] > out[2]


def test_the_front_drops_dominated_and_repeated_points_and_the_reference_lies_below():
    pts = np.array([[1.0, 3.0], [2.0, 2.0], [1.0, 1.0], [2.0, 2.0], [3.0, 0.5]])
    assert nondominated(pts).tolist() == [[1.0, 3.0], [2.0, 2.0], [3.0, 0.5]]
    ref = reference(pts)
    assert np.all(ref < pts.min(axis=0))
    assert np.allclose(reference(np.array([[2.0, 5.0]]), span=np.array([10.0, 0.0])), [1.0, 4.9])


def _config():
    return load_config({
        "engine": {"kind": "command", "settings": {
            "argv": ["x", "{a}"],
            "knobs": {"a": {"type": "int", "low": 0, "high": 15},
                      "mode": {"type": "str", "choices": ["x", "y", "z"]},
                      "flag": {"type": "bool"}},
            "defaults": {"a": 0, "mode": "x", "flag": False}}},
        "space": {"a": {"type": "int", "low": 0, "high": 15},
                  "mode": {"type": "categorical", "choices": ["x", "y", "z"]},
                  "flag": {"type": "categorical", "choices": [False, True]}},
        "rules": [{"when": "mode == 'z'", "require": "not flag", "reason": "z cannot flag"}],
        "objectives": ["decode_tps", "vram_peak_gb"],
        "constraints": ["ttft_p95_ms <= 140"],
        "quality": {"enabled": False},
        "study": {"search": "pareto"},
    })


def metrics(p: dict) -> dict:
    """Speed and memory both grow with a (the trade-off); mode y is faster for free, the flag
    is faster for memory; TTFT breaks its bound above a = 12."""
    a, flag = p["a"], p["flag"]
    return {"decode_tps": 10.0 + 3 * a + {"x": 0, "y": 4, "z": -2}[p["mode"]] + 6 * flag,
            "vram_peak_gb": 2.0 + 0.5 * a + 1.5 * flag, "ttft_p95_ms": 20.0 + 10.0 * a}


def _share(points: list[tuple[float, float]], cfg, space) -> float:
    """Hypervolume of the feasible ``points`` (decode, vram) as a share of the true front's."""
    every = [(m["decode_tps"], -m["vram_peak_gb"]) for c in space.configurations(limit=1000, seed=0)
             if not space.violations(c) and (m := metrics(c))["ttft_p95_ms"] <= 140]
    Y = np.array(every)
    ref = Y.min(axis=0) - 0.1 * np.ptp(Y, axis=0)
    return _hv(np.array([(d, -v) for d, v in points]), ref) / _hv(Y, ref)


def _pareto_study(seed: int):
    """The config, its space, bo for a Pareto search over decode speed and VRAM, a study."""
    cfg = _config()
    space = compile_space(cfg)
    sampler = PoolSampler(space, lambda: build_pool(space, lambda p: (True, None), 0), cfg.constraints, seed,
                          n_startup=4, objectives=["decode_tps", "vram_peak_gb"])
    return cfg, space, sampler, optuna.create_study(directions=studylib.directions(cfg), sampler=sampler)


def test_bo_finds_the_true_feasible_front_and_stays_out_of_the_infeasible_region():
    cfg, space, sampler, study = _pareto_study(0)
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    for p in ({"a": 0, "mode": "x", "flag": False}, {"a": 15, "mode": "z", "flag": False},
              {"a": 7, "mode": "y", "flag": True}, {"a": 4, "mode": "x", "flag": True}):
        study.enqueue_trial(p)
    seen, feasible = [], []
    for _ in range(20):
        trial = study.ask()
        params = space.suggest(trial)
        m = metrics(params)
        studylib.tell(study, trial, cfg, params, TrialResult(trial.number, "ok", m))
        seen.append(params)
        if m["ttft_p95_ms"] <= 140:
            feasible.append((m["decode_tps"], m["vram_peak_gb"]))
    assert len({tuple(sorted(p.items())) for p in seen}) == len(seen)  # never the same twice
    assert not any(space.violations(p) for p in seen)
    assert sum(p["a"] > 12 for p in seen[4:]) <= 2  # past the TTFT bound, after the design
    assert _share(feasible, cfg, space) >= 0.95
    assert sampler.last_sizes["train"] == 19


def test_trials_in_flight_enter_the_pareto_search_and_are_not_proposed_again():
    cfg, space, sampler, study = _pareto_study(1)
    told = []
    for _ in range(6):
        trial = study.ask()
        told.append(space.suggest(trial))
        studylib.tell(study, trial, cfg, told[-1], TrialResult(trial.number, "ok", metrics(told[-1])))
    running = [space.suggest(study.ask()) for _ in range(3)]  # three slots busy, none told
    assert sampler.last_sizes["train"] == 6  # the model asks saw the six told trials
    keys = [config_key(p) for p in running]
    assert len(set(keys)) == 3 and not set(keys) & {config_key(p) for p in told}
