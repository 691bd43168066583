"""``study.sampler: bo``: constrained Bayesian optimisation over the launchable configurations.

Engine spaces are finite and ruled (quantizations, cache modes, splits, batch sizes). A
sampler that optimises its acquisition over a continuous relaxation keeps proposing
configurations that break a rule, will not fit or were measured already, and each such
proposal is a fake point its model must absorb. This sampler scores the *pool* instead:
every configuration of the space (a random sample of a continuous or huge one) that passes
the rules, the engine's check and its pre-launch fit prediction, less what was already
proposed. It never proposes a configuration the driver would refuse.

The model is scikit-learn's Gaussian process (Matern 5/2, one length scale per feature,
fitted noise), one per quantity:

* the objective, on a log scale when it is a positive speed. When the engine predicts a
  decode-speed bound for every configuration (:mod:`autotune.engines.predict`) and the objective is
  decode speed, the GP models the residual ``log(measured) - s * log(bound)``, where ``s``
  in [0, 1] is fitted to the measurements: a configuration far from anything measured still
  ranks by what is known about it, as much as the measurements trust the bound;
* each constraint as its relative violation (``<= 0`` holds); and, once a launch failed,
  whether a launch runs at all (+1 ran, -1 crashed or ran out of memory).

The next configuration maximises expected improvement over the best feasible posterior mean
(robust to timing noise) times the probability that every constraint holds and the run
succeeds. Trials in flight are added at their posterior mean (kriging believer), so parallel
proposals spread out. Features: a numeric value (or a two-way choice) by its position on
the parameter's scale, other choices one-hot, a conditional parameter's activity as its own
column.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState
from scipy.stats import norm

from autotune.search.design import config_key
from autotune.search.design import to_unit
from autotune.search.space import decode
from autotune.search.space import encode

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from autotune.config.schema import Constraint
    from autotune.search.space import Param
    from autotune.search.space import Space

POOL_LIMIT = 100_000  # a larger space (or a continuous one) is represented by 4,000 random configurations


@dataclass
class Pool:
    """The launchable configurations, one feature row each, and the log of their predicted
    decode-speed bound (None unless the engine predicts one for every configuration)."""

    params: list[dict[str, Any]]
    keys: list[str]
    X: np.ndarray
    log_bound: np.ndarray | None


def _ordered(p: Param) -> bool:
    """Whether ``p``'s values have an order the model may use (numbers, or two choices)."""
    vals = p.values()
    if vals is None or not isinstance(p.dist, CategoricalDistribution) or len(vals) <= 2:
        return True
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)


def featurize(space: Space, configs: list[dict[str, Any]]) -> np.ndarray:
    """One row of features per configuration (see the module docstring)."""
    cols: list[list[float]] = []
    for p in space.params.values():
        if p.dist is None:
            continue
        if _ordered(p):
            cols.append([to_unit(p, c[p.name]) if p.name in c else 0.0 for c in configs])
        else:
            for v in p.values():
                cols.append([float(p.name in c and encode(c[p.name]) == encode(v)) for c in configs])
        if p.when is not None:
            cols.append([float(p.name in c) for c in configs])
    return np.array(cols, dtype=float).T if cols else np.zeros((len(configs), 1))


def build_pool(space: Space, screen: Callable[[dict[str, Any]], tuple[bool, float | None]],
               seed: int | None = None, limit: int = POOL_LIMIT) -> Pool:
    """Every launchable configuration: no rule broken, the engine's check passed and
    ``screen(params)`` -> (may run, predicted decode bound or None) saying it may run."""
    seen: set[str] = set()
    params, bounds = [], []
    for c in space.configurations(limit=limit, seed=seed or 0):
        key = config_key(c)
        if key in seen:
            continue
        seen.add(key)
        if space.violations(c):
            continue
        fits, bound = screen(c)
        if fits:
            params.append(c)
            bounds.append(bound)
    known = bool(params) and all(b is not None and b > 0 for b in bounds)
    return Pool(params, [config_key(c) for c in params], featurize(space, params),
                np.log(np.array(bounds, dtype=float)) if known else None)


class _GP:
    """A fitted GP (and its kernel, to add trials in flight without refitting)."""

    def __init__(self, X: np.ndarray, y: np.ndarray, seed: int, pending: np.ndarray) -> None:
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel
        from sklearn.gaussian_process.kernels import Matern
        from sklearn.gaussian_process.kernels import WhiteKernel

        kernel = ConstantKernel(1.0, (1e-2, 1e2)) * Matern(
            length_scale=np.full(X.shape[1], 0.5), length_scale_bounds=(0.05, 20.0), nu=2.5
        ) + WhiteKernel(1e-2, (1e-5, 0.5))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a length scale at its bound is fine here
            self.fitted = GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=2,
                                                   random_state=seed).fit(X, y)
            self.believer = self.fitted
            if len(pending):  # kriging believer: in-flight trials at their posterior mean
                self.believer = GaussianProcessRegressor(self.fitted.kernel_, normalize_y=True, optimizer=None)
                self.believer.fit(np.vstack([X, pending]), np.concatenate([y, self.fitted.predict(pending)]))

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mu, sd = self.believer.predict(X, return_std=True)
        return mu, np.maximum(sd, 1e-9)


class PoolSampler(optuna.samplers.BaseSampler):
    """Constrained GP expected improvement over a :class:`Pool` (see the module docstring).

    ``pool_fn`` builds the pool on first use. Until ``n_startup`` trials were launched (the
    driver's startup design normally provides them) and two of them ran, it proposes pool
    configurations at random. Only single-objective studies: the told value is the scalar
    the winner is chosen by; the constraints' values are read from each trial's metrics.
    """

    def __init__(self, space: Space, pool_fn: Callable[[], Pool], constraints: list[Constraint],
                 seed: int | None = None, n_startup: int = 2) -> None:
        self.space = space
        self.constraints = constraints
        self.n_startup = n_startup
        self._pool_fn = pool_fn
        self._pool: Pool | None = None
        self._rng = np.random.default_rng(seed)
        self._random = optuna.samplers.RandomSampler(seed=seed)

    @property
    def pool(self) -> Pool:
        if self._pool is None:
            self._pool = self._pool_fn()
        return self._pool

    def reseed_rng(self) -> None:
        self._rng = np.random.default_rng()
        self._random.reseed_rng()

    def infer_relative_search_space(self, study, trial):
        return {p.name: p.dist for p in self.space.params.values() if p.dist is not None}

    def sample_relative(self, study, trial, search_space):
        if not search_space or trial.system_attrs.get("fixed_params"):
            return {}  # an enqueued trial (baseline, design, re-run) brings its own values
        choice = self.choose(study)
        return {} if choice is None else {k: encode(v) for k, v in choice.items() if k in search_space}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def is_exhausted(self, study: optuna.Study) -> bool:
        """Every launchable configuration has been proposed and nothing enqueued is left
        (the driver then ends the study)."""
        trials = study.get_trials(deepcopy=False)
        return not any(t.state == TrialState.WAITING for t in trials) and not len(self._free(_keys(trials)))

    # ---- the choice ------------------------------------------------------------------
    def _free(self, keys: dict[int, str]) -> np.ndarray:
        """Pool rows of the configurations no trial has proposed yet."""
        told = set(keys.values())
        return np.array([i for i, k in enumerate(self.pool.keys) if k not in told], dtype=int)

    def choose(self, study: optuna.Study) -> dict[str, Any] | None:
        """The free pool configuration with the highest acquisition (None: none is left)."""
        pool = self.pool
        trials = study.get_trials(deepcopy=False)
        keys = _keys(trials)
        free = self._free(keys)
        if not len(free):
            return None
        index = {k: i for i, k in enumerate(pool.keys)}
        row = {n: index[k] for n, k in keys.items() if k in index}  # trial number -> pool row
        # a launch that failed before any succeeded is told FAIL (nothing to call worst yet)
        launched = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAIL)
                    and t.user_attrs.get("kind") == "launched" and t.number in row]
        ok = [t for t in launched if t.user_attrs.get("status") == "ok" and t.values]
        if len(launched) < self.n_startup or len(ok) < 2:
            return pool.params[int(self._rng.choice(free))]
        pending = pool.X[[row[t.number] for t in trials if t.state == TrialState.RUNNING and t.number in row]]
        rows_ok = np.array([row[t.number] for t in ok])
        seed = int(self._rng.integers(2**31))
        Xf = pool.X[free]

        maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
        values = np.array([t.values[0] for t in ok], dtype=float)
        logged = bool(np.all(values > 0))
        y = (np.log(values) if logged else values) * (1.0 if maximize else -1.0)
        prior = np.zeros(len(pool.keys))
        if pool.log_bound is not None and logged and maximize:
            trust = np.linalg.lstsq(np.vstack([pool.log_bound[rows_ok], np.ones(len(ok))]).T, y, rcond=None)[0][0]
            prior = float(np.clip(trust, 0.0, 1.0)) * pool.log_bound
        gp = _GP(pool.X[rows_ok], y - prior[rows_ok], seed, pending)
        mu, sd = gp.predict(Xf)
        mu = mu + prior[free]
        log_pf = self._log_p_feasible(ok, launched, row, pending, Xf, seed)

        feasible = np.array([all(v <= 0 for v in dict(t.constraints or {}).values()) for t in ok])
        if not feasible.any():  # nothing feasible yet: the likeliest feasible, faster first
            return pool.params[int(free[np.argmax(log_pf + 1e-3 * mu)])]
        best = float(np.max((gp.fitted.predict(pool.X[rows_ok]) + prior[rows_ok])[feasible]))
        z = (mu - best) / sd
        log_ei = np.log(np.maximum(sd * (z * norm.cdf(z) + norm.pdf(z)), 1e-300))
        return pool.params[int(free[np.argmax(log_ei + log_pf)])]

    def _log_p_feasible(self, ok: list[FrozenTrial], launched: list[FrozenTrial], row: dict[int, int],
                        pending: np.ndarray, Xf: np.ndarray, seed: int) -> np.ndarray:
        """log P(every constraint holds and the run succeeds) per free configuration."""
        out = np.zeros(len(Xf))
        for c in self.constraints:
            seen = [(row[t.number], t.user_attrs["metrics"][c.metric])
                    for t in ok if c.metric in t.user_attrs.get("metrics", {})]
            z = np.array([c.violation(v) / max(abs(c.bound), 1e-9) for _, v in seen])
            if len(seen) < 2 or np.all(z < -0.5):
                continue  # too few values, or far inside its bound everywhere measured
            mu, sd = _GP(self.pool.X[[r for r, _ in seen]], z, seed, pending).predict(Xf)
            out += norm.logcdf(-mu / sd)
        if any(t.user_attrs.get("status") != "ok" for t in launched):
            ran = np.array([1.0 if t.user_attrs.get("status") == "ok" else -1.0 for t in launched])
            X = self.pool.X[[row[t.number] for t in launched]]
            mu, sd = _GP(X, ran, seed, pending).predict(Xf)
            out += norm.logcdf(mu / sd)
        return out


def _keys(trials: list[FrozenTrial]) -> dict[int, str]:
    """Each trial's configuration key: from what the driver stored, else Optuna's params."""
    return {t.number: config_key(t.user_attrs.get("params") or {k: decode(v) for k, v in t.params.items()})
            for t in trials}
