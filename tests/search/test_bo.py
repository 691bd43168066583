"""``study.sampler: bo``: constrained GP over the pool of launchable configurations.

Real Optuna studies told through :func:`autotune.record.optuna_study.tell` (the driver's own path) on a
command-engine space with a rule; the objective is a known function, so a search that does
not use what it measured fails these tests.
"""

from __future__ import annotations

import io
import math

import numpy as np
import optuna
import pytest
from rich.console import Console

from autotune.config.schema import load_config
from autotune.config.validate import compile_space
from autotune.output.report import Reporter
from autotune.record import optuna_study as studylib
from autotune.run.driver import Driver
from autotune.search import bo as bolib
from autotune.search.batch import length_scale
from autotune.search.bo import _GP
from autotune.search.bo import LENGTH_SCALE_MIN
from autotune.search.bo import PoolSampler
from autotune.search.design import config_key
from autotune.search.design import has_speed_prior
from autotune.search.design import ranks_by_speed
from autotune.search.design import trial_keys
from autotune.search.pool import build_pool
from autotune.search.pool import featurize
from autotune.search.subsample import candidate_rows
from autotune.search.subsample import train_rows
from autotune.trial.spec import TrialResult


def _config(**study):
    return load_config({
        "engine": {"kind": "command", "settings": {
            "argv": ["x", "{a}"],
            "knobs": {"a": {"type": "int", "low": 0, "high": 9},
                      "mode": {"type": "str", "choices": ["x", "y", "z"]},
                      "flag": {"type": "bool"},
                      "k": {"type": "int", "low": 1, "high": 3}},
            "defaults": {"a": 0, "mode": "x", "flag": False, "k": 1}}},
        "space": {"a": {"type": "int", "low": 0, "high": 9},
                  "mode": {"type": "categorical", "choices": ["x", "y", "z"]},
                  "flag": {"type": "categorical", "choices": [False, True]},
                  "k": {"type": "int", "low": 1, "high": 3, "when": "flag"}},
        "rules": [{"when": "mode == 'z'", "require": "not flag", "reason": "z cannot flag"}],
        "objectives": ["decode_tps"],
        "constraints": ["ttft_p95_ms <= 100"],
        "quality": {"enabled": False},
        "study": study,
    })


def metrics(p: dict) -> dict:
    """Speed grows with a (and mode y, flag); TTFT breaks its bound above a = 8."""
    tps = 10 + 2 * p["a"] + {"x": 0, "y": 5, "z": -3}[p["mode"]] + (p.get("k", 0) if p["flag"] else 0)
    return {"decode_tps": float(tps), "ttft_p95_ms": 20.0 + 10.0 * p["a"]}


OPTIMUM = {"a": 8, "mode": "y", "flag": True, "k": 3}


def _study(cfg, sampler):
    return optuna.create_study(directions=studylib.directions(cfg), sampler=sampler)


def _step(study, cfg, space, measure=metrics):
    trial = study.ask()
    params = space.suggest(trial)
    studylib.tell(study, trial, cfg, params, TrialResult(trial.number, "ok", measure(params)))
    return params


def _sampler(cfg, space, seed=0, screen=lambda p: (True, None), n_startup=3):
    return PoolSampler(space, lambda: build_pool(space, screen, seed), cfg.constraints, seed, n_startup,
                       objectives=studylib.told_names(cfg))


def test_pool_holds_exactly_the_launchable_configurations():
    cfg = _config()
    space = compile_space(cfg)
    pool = build_pool(space, lambda p: (p["a"] != 5, None))
    assert len(pool.keys) == len(set(pool.keys))
    assert all(not space.violations(p) and p["a"] != 5 for p in pool.params)
    # 10 a x (x, y: no flag + flag x 3 k; z: no flag) minus a == 5
    assert len(pool.params) == 9 * (2 * (1 + 3) + 1)
    assert pool.log_bound is None  # no speed prediction


def test_features_order_numbers_one_hot_names_and_mark_inactive_knobs():
    space = compile_space(_config())
    X = featurize(space, [{"a": 0, "mode": "x", "flag": False}, {"a": 9, "mode": "z", "flag": True, "k": 3}])
    # a (position), mode one-hot (3), flag (two choices: position), k (position), k active
    assert X.shape == (2, 7)
    assert X[0].tolist() == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert X[1].tolist() == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def test_choices_declared_ordered_are_one_position_not_one_hot():
    cfg = _config()
    cfg.raw["space"]["mode"]["ordered"] = True
    space = compile_space(load_config(cfg.raw))
    assert space.params["mode"].ordered and not space.params["a"].ordered
    X = featurize(space, [{"a": 0, "mode": m, "flag": False} for m in ("x", "y", "z")])
    # a, mode (position in the listed order), flag, k, k active
    assert X.shape == (3, 5)
    assert X[:, 1].tolist() == [0.0, 0.5, 1.0]
    # a Pareto search's pool keeps them one-hot (autotune.run.driver.Driver.pool)
    assert featurize(space, [{"a": 0, "mode": "y", "flag": False}], ordered=False)[0, 1:4].tolist() == [0.0, 1.0, 0.0]
    pool = build_pool(space, lambda _p: (True, None), ordered=False)
    assert pool.X.shape[1] == 7 and not pool.ordered


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_finds_the_constrained_optimum_in_a_fraction_of_the_space(seed):
    cfg = _config()
    space = compile_space(cfg)
    sampler = _sampler(cfg, space, seed)
    study = _study(cfg, sampler)
    size = len(sampler.pool.params)
    seen = [_step(study, cfg, space) for _ in range(15)]
    assert OPTIMUM in seen, (size, seen)  # 15 of 69: random finds it by then in 22% of seeds
    keys = [config_key(p) for p in seen]
    assert len(set(keys)) == len(keys)  # never a configuration twice
    assert all(not space.violations(p) for p in seen)  # never one that breaks a rule


def test_proposes_every_configuration_once_then_is_exhausted():
    cfg = _config()
    space = compile_space(cfg)
    sampler = _sampler(cfg, space, 0, screen=lambda p: (p["a"] < 3, None))
    study = _study(cfg, sampler)
    n = len(sampler.pool.params)
    seen = {config_key(_step(study, cfg, space)) for _ in range(n)}
    assert len(seen) == n == 3 * 9
    assert sampler.is_exhausted(study)


def test_a_trial_in_flight_is_not_proposed_again():
    cfg = _config()
    space = compile_space(cfg)
    study = _study(cfg, _sampler(cfg, space, 0))
    for _ in range(5):
        _step(study, cfg, space)
    a, b = study.ask(), study.ask()  # a is running (not told) while b is asked
    pa, pb = space.suggest(a), space.suggest(b)
    assert config_key(pa) != config_key(pb)


def test_failed_launches_steer_the_search_away():
    """Configurations with flag crash: once a few did, flagged proposals become rare."""
    cfg = _config()
    space = compile_space(cfg)
    study = _study(cfg, _sampler(cfg, space, 3))

    seen = []
    for _ in range(16):
        trial = study.ask()
        p = space.suggest(trial)
        result = TrialResult(trial.number, "failed", reason="crash") if p["flag"] \
            else TrialResult(trial.number, "ok", metrics(p))
        studylib.tell(study, trial, cfg, p, result)
        seen.append(p)
    late = seen[8:]
    assert sum(p["flag"] for p in late) <= 2, late
    assert {"a": 8, "mode": "y", "flag": False} in seen  # the best configuration that runs


def test_the_speed_prediction_is_the_prior_for_unmeasured_configurations():
    """Measured speed is half the predicted bound everywhere; after the startup trials the
    model proposes the configuration with the highest bound (mode z: predicted 1.5x), though
    nothing near it ran."""
    cfg = _config()
    space = compile_space(cfg)
    bound = {config_key(p): 2.0 * metrics(p)["decode_tps"] * (1.0 + 0.5 * (p["mode"] == "z"))
             for p in space.configurations()}
    sampler = _sampler(cfg, space, 0, screen=lambda p: (True, bound[config_key(p)]))
    study = _study(cfg, sampler)
    low = [{"a": 0, "mode": "x", "flag": False}, {"a": 2, "mode": "y", "flag": False},
           {"a": 1, "mode": "x", "flag": True, "k": 1}]
    for p in low:
        study.enqueue_trial(p)
        _step(study, cfg, space, lambda q: {**metrics(q), "decode_tps": bound[config_key(q)] / 2})
    assert sampler.pool.log_bound is not None
    nxt = _step(study, cfg, space)
    free = [p for p in sampler.pool.params if p not in low]  # TTFT far inside its bound so far
    assert math.isclose(bound[config_key(nxt)], max(bound[config_key(p)] for p in free)), nxt
    assert np.isfinite(sampler.pool.log_bound).all()


def test_the_speed_bound_is_a_prior_for_decode_speed_only():
    """The bound enters the GP's mean when decode speed is what the study maximises; told
    goodput (a serving study), the same bound gives a zero mean."""
    cfg = _config()
    space = compile_space(cfg)
    bound = {config_key(p): 2.0 * metrics(p)["decode_tps"] for p in space.configurations()}
    rows = np.array([0, 1, 2])
    for objectives, zero in ((["decode_tps"], False), (["goodput_tps"], True)):
        sampler = PoolSampler(space, lambda: build_pool(space, lambda p: (True, bound[config_key(p)]), 0),
                              cfg.constraints, 0, 3, objectives=objectives)
        y = sampler.pool.log_bound[rows] - math.log(2.0)
        prior = sampler.prior(0, rows, y, log_speed=True)
        assert (not prior.any()) is zero, objectives
        assert not sampler.prior(0, rows, y, log_speed=False).any()  # a minimised or signed value


def test_a_bound_equal_everywhere_is_no_prior():
    """A bound that does not vary (llama-server's weights over RAM bandwidth, the same for every
    parallel and threads) ranks nothing: the pool has no bounds, the design keeps its spread
    and the driver's no-prior startup applies."""
    cfg = _config()
    space = compile_space(cfg)
    assert build_pool(space, lambda p: (True, 50.0)).log_bound is None
    assert build_pool(space, lambda p: (True, 50.0 + p["a"])).log_bound is not None
    assert not ranks_by_speed([50.0, 50.0]) and not ranks_by_speed([]) and not ranks_by_speed([1.0, None])
    assert ranks_by_speed([50.0, 51.0])
    assert not has_speed_prior(space, 0, lambda p: (True, 50.0))
    assert has_speed_prior(space, 0, lambda p: (True, 50.0 + p["a"]))


def test_training_and_candidate_sets_stay_bounded_as_the_study_grows():
    """With caps far below the study's size, every ask fits on at most ``max_train`` trials
    and scores at most ``max_candidates`` configurations, and still never repeats one."""
    cfg = _config()
    space = compile_space(cfg)
    sampler = PoolSampler(space, lambda: build_pool(space, lambda p: (True, None), 0), cfg.constraints,
                          0, n_startup=3, max_train=8, max_candidates=12)
    study = _study(cfg, sampler)
    sizes = []
    for _ in range(30):
        _step(study, cfg, space)
        sizes.append(dict(sampler.last_sizes))
    assert max(s.get("train", 0) for s in sizes) == 8
    assert max(s.get("candidates", 0) for s in sizes) == 12
    assert len({config_key(t.user_attrs["params"]) for t in study.trials}) == 30


def test_the_subsets_keep_the_best_and_respect_their_caps():
    rng = np.random.default_rng(0)
    score = rng.normal(size=5000)
    feasible = rng.random(5000) < 0.1
    rows = train_rows(score, feasible, 200, rng)
    assert len(rows) == len(set(rows.tolist())) == 200
    assert int(np.argmax(score)) in rows and int(np.argmax(np.where(feasible, score, -np.inf))) in rows
    assert len(train_rows(score[:50], feasible[:50], 200, rng)) == 50
    X = rng.random((100_000, 6))
    free = np.arange(0, 100_000, 2)
    bound = X[:, 0]
    pos = candidate_rows(X, free, bound, np.array([1, 3]), 4000, rng)
    assert len(pos) == len(set(pos.tolist())) == 4000
    assert int(np.argmax(bound[free])) in pos  # the highest-predicted free configuration
    near = int(np.argmin(np.abs(X[free] - X[1]).sum(axis=1)))
    assert near in pos  # the nearest free neighbour of a best measured row


def test_a_few_zigzag_measurements_do_not_shrink_the_length_scales_below_the_floor():
    """Ten measurements alternating up and down along one knob (what timing noise or a
    crash edge looks like early in a study): fitted freely, the GP explains them with a length
    scale of 0.05 of the knob's range (the old floor) and then knows nothing between two
    measured values; the floor (LENGTH_SCALE_MIN, 0.2 of a feature's range: bo.py and
    bench/results/robust.txt) keeps neighbouring configurations correlated."""
    assert LENGTH_SCALE_MIN >= 0.2
    x = np.linspace(0.0, 1.0, 10)
    X = np.column_stack([x, np.zeros(10)])
    y = np.where(np.arange(10) % 2 == 0, 1.0, 0.0) + 0.5 * x
    gp = _GP(X, y, 0, X[:0])
    scales = length_scale(gp.fitted.kernel_, 2)
    assert scales.min() >= LENGTH_SCALE_MIN - 1e-9
    assert scales[0] < 0.5  # the zigzag knob's scale sits at (or near) the floor, not far above


# speed, true perplexity delta: 0.8 times llama.cpp's table on Llama-3-8B (Q4_K_M 2.81, Q5_K_M
# 0.91, Q6_K 0.35, Q8_0 0.04 %), the convex curve an ordered scale interpolates wrongly.
QUANTS = {"q4": (40.0, 2.25), "q5": (34.0, 0.73), "q6": (29.0, 0.28), "q8": (22.0, 0.03)}
TABLE = "2.81 if q == 'q4' else 0.91 if q == 'q5' else 0.35 if q == 'q6' else 0.04"


@pytest.mark.parametrize(("expect", "on"), [(True, True), (True, False), (False, True)])
def test_the_users_quality_table_is_the_constraint_gps_prior(expect, on, monkeypatch):
    """``predict.expect`` (issue 41): measured q4, q6 and q8, bo tells whether the untried q5 meets
    ``ppl_delta_pct <= 1``. Its value lies on a convex curve: interpolated on the quant's ordered
    position between q4 (2.25) and q6 (0.28) it reads as over the bound; the table, trusted as far
    as the measurements follow it (0.8 of it here), says it holds. Through the driver's pool, which
    reads each configuration's expected value from the engine's prediction."""
    monkeypatch.setattr(bolib, "EXPECT", on)
    settings = {"argv": ["x", "{q}", "{a}"], "defaults": {"q": "q8", "a": 0},
                "knobs": {"q": {"type": "str", "choices": list(QUANTS)}, "a": {"type": "int", "low": 0, "high": 3}}}
    if expect:
        settings["predict"] = {"expect": {"ppl_delta_pct": TABLE}}
    cfg = load_config({"engine": {"kind": "command", "settings": settings},
                       "space": {"q": {"type": "categorical", "choices": list(QUANTS), "ordered": True},
                                 "a": {"type": "int", "low": 0, "high": 3}},
                       "objectives": ["decode_tps"], "constraints": ["ppl_delta_pct <= 1.0"],
                       "quality": {"enabled": False}})
    space = compile_space(cfg)
    driver = Driver(cfg, space, None, None, Reporter(cfg, Console(file=io.StringIO())))
    sampler = PoolSampler(space, driver.pool, cfg.constraints, 0, 3, objectives=studylib.told_names(cfg))
    study = _study(cfg, sampler)
    for start in [{"q": "q4", "a": 0}, {"q": "q6", "a": 3}, {"q": "q8", "a": 1}, {"q": "q4", "a": 2}]:
        study.enqueue_trial(start)
        _step(study, cfg, space, lambda p: {"decode_tps": QUANTS[p["q"]][0] + p["a"], "ppl_delta_pct": QUANTS[p["q"]][1]})
    pool, trials = sampler.pool, study.get_trials()
    assert (pool.expected("ppl_delta_pct") is not None) == expect
    row = {n: pool.index[k] for n, k in trial_keys(trials).items()}
    q5 = np.array([i for i, p in enumerate(pool.params) if p["q"] == "q5"])
    p_ok = np.exp(sampler._log_p_feasible(trials, trials, row, pool.X[:0], q5, 0))
    assert (p_ok > 0.9).all() if expect and on else (p_ok < 0.5).all(), p_ok


def test_pool_expected_values_follow_the_pool_as_it_grows():
    """:meth:`Pool.expected` asks the engine's expectation once per row, lazily, and extends it
    as a sampled pool grows; a metric the first row's prediction does not expect is never asked
    of the others."""
    cfg = _config()
    space = compile_space(cfg)
    asked = []

    def expect(p):
        asked.append(p)
        return {"ttft_p95_ms": 20.0 + 10.0 * p["a"]}

    pool = build_pool(space, lambda p: (True, None), 0, limit=10, expect=expect)  # a sample: it grows
    assert pool.space is not None and pool.expected("decode_tps") is None and len(asked) == 1
    got = pool.expected("ttft_p95_ms")
    assert list(got) == [20.0 + 10.0 * p["a"] for p in pool.params] and len(asked) == 1 + len(pool.params)
    new = [c for c in space.configurations(limit=200, seed=1)
           if config_key(c) not in pool.index and not space.violations(c)][:5]
    assert pool.grow(new) == len(new)
    assert list(pool.expected("ttft_p95_ms")) == [20.0 + 10.0 * p["a"] for p in pool.params]
    assert pool.expected("decode_tps") is None and len(asked) == 1 + len(pool.params)
