"""``bo`` with trials in flight (:mod:`autotune.search.batch`): real Optuna studies, asked
while earlier trials are still RUNNING, as the driver does with ``ray.max_concurrent > 1``."""

from __future__ import annotations

import itertools

import numpy as np
import optuna
import pytest

from autotune.config.validate import compile_space
from autotune.record import optuna_study as studylib
from autotune.search import batch as batchlib
from autotune.search.bo import PoolSampler
from autotune.search.design import config_key
from autotune.search.pool import build_pool
from autotune.trial.spec import TrialResult
from tests.search.test_bo import _config
from tests.search.test_bo import metrics


def _sampler(cfg, space, batch, seed=0, n_startup=3):
    return PoolSampler(space, lambda: build_pool(space, lambda p: (True, None), seed), cfg.constraints,
                       seed, n_startup, batch=batch)


def _tell(study, cfg, trial, params):
    studylib.tell(study, trial, cfg, params, TrialResult(trial.number, "ok", metrics(params)))


def _ask(study, space):
    trial = study.ask()
    params = space.suggest(trial)
    studylib.mark_launched(trial, params, None)  # what the driver stores before launching
    return trial, params


def _batch_after(cfg, space, batch, told=6, slots=4, seed=0):
    """``told`` trials one at a time, then ``slots`` proposals asked with none told."""
    sampler = _sampler(cfg, space, batch, seed)
    study = optuna.create_study(directions=studylib.directions(cfg), sampler=sampler)
    for _ in range(told):
        _tell(study, cfg, *_ask(study, space))
    return sampler, [_ask(study, space)[1] for _ in range(slots)]


@pytest.mark.parametrize("batch", batchlib.MODES)
def test_proposals_made_while_others_run_are_distinct_and_spread(batch):
    cfg = _config()
    space = compile_space(cfg)
    sampler, proposals = _batch_after(cfg, space, batch)
    keys = [config_key(p) for p in proposals]
    assert len(set(keys)) == 4  # never one in flight again
    X = sampler.pool.X[[sampler.pool.keys.index(k) for k in keys]]
    gaps = [np.abs(a - b).sum() for a, b in itertools.combinations(X, 2)]
    # not four one-step neighbours of one configuration: some pair differs by more than a step
    assert max(gaps) > 1.0 / 9 + 1e-9, proposals


def test_fantasy_proposals_spread_at_least_as_wide_as_the_believer():
    """(Local penalization did not: 1.52 against 1.99 mean L1 gap on these seeds.)"""
    batch = "fantasy"
    cfg = _config()
    space = compile_space(cfg)
    spread = {}
    for mode in ("believer", batch):
        widths = []
        for seed in range(3):
            sampler, proposals = _batch_after(cfg, space, mode, seed=seed)
            X = sampler.pool.X[[sampler.pool.keys.index(config_key(p)) for p in proposals]]
            widths.append(np.mean([np.abs(a - b).sum() for a, b in itertools.combinations(X, 2)]))
        spread[mode] = float(np.mean(widths))
    assert spread[batch] >= 0.8 * spread["believer"], spread


def test_with_nothing_in_flight_every_acquisition_proposes_the_same():
    """Sequential studies (one slot) are unchanged: the same seed gives the same trials."""
    cfg = _config()
    space = compile_space(cfg)
    runs = {}
    for batch in batchlib.MODES:
        study = optuna.create_study(directions=studylib.directions(cfg), sampler=_sampler(cfg, space, batch))
        seen = []
        for _ in range(10):
            trial, params = _ask(study, space)
            _tell(study, cfg, trial, params)
            seen.append(config_key(params))
        runs[batch] = seen
    assert runs["fantasy"] == runs["believer"] == runs["penalize"]


def test_trials_in_flight_count_towards_the_startup():
    """With three slots busy after two results, the model proposes (not a random pick)."""
    cfg = _config()
    space = compile_space(cfg)
    sampler = _sampler(cfg, space, "fantasy", n_startup=5)
    study = optuna.create_study(directions=studylib.directions(cfg), sampler=sampler)
    for _ in range(2):
        _tell(study, cfg, *_ask(study, space))
    for _ in range(3):
        _ask(study, space)
    asks = sampler._asks
    _ask(study, space)
    assert sampler._asks == asks + 1


def test_an_unknown_acquisition_is_refused():
    cfg = _config()
    space = compile_space(cfg)
    with pytest.raises(ValueError, match="believer, fantasy, penalize"):
        _sampler(cfg, space, "qei")


def test_fantasies_lower_the_value_of_a_twin_of_a_promising_trial_in_flight():
    """A candidate next to a trial in flight that the GP expects to win gains less under the
    fantasies than under plain EI; one far from it keeps most of its value."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF
    from sklearn.gaussian_process.kernels import WhiteKernel

    X = np.array([[0.0], [0.2], [0.5], [0.8], [1.0]])
    y = np.array([0.0, 0.5, 0.2, 0.9, 1.0])
    gp = GaussianProcessRegressor(RBF(0.15) + WhiteKernel(1e-4), normalize_y=True, optimizer=None).fit(X, y)
    pending, Xc = np.array([[0.95]]), np.array([[0.93], [0.35]])
    mu, sd = gp.predict(Xc, return_std=True)
    plain = batchlib.log_ei(mu, sd, 1.0)
    fant = batchlib.fantasy_log_ei(gp, pending, np.zeros(1), np.ones(1), Xc, np.zeros(2), 1.0,
                                   np.random.default_rng(0), n=64)
    assert fant[0] - plain[0] < fant[1] - plain[1]
