"""``study.sampler: bo``: constrained Bayesian optimisation over the launchable configurations.

Engine spaces are finite and ruled (quantizations, cache modes, splits, batch sizes). A
sampler that optimises its acquisition over a continuous relaxation keeps proposing
configurations that break a rule, will not fit or were measured already, and each such
proposal is a fake point its model must absorb. This sampler scores the *pool* instead:
every configuration of the space (a random sample of a continuous or huge one) that passes
the rules, the engine's check and its pre-launch fit prediction, less what was already
proposed. It never proposes a configuration the driver would refuse.

The pool (:mod:`autotune.search.pool`) of a continuous or huge space is a sample; it grows
near the best measured configurations as the study goes (:mod:`autotune.search.refine`).

The model is scikit-learn's Gaussian process (Matern 5/2, one length scale per feature, none
below ``LENGTH_SCALE_MIN`` of the feature's range, fitted noise), one per quantity:

* the objective, on a log scale when it is a positive speed. When the engine predicts a
  decode-speed bound for every configuration (:mod:`autotune.engines.predict`) and the objective is
  decode speed, the GP models the residual ``log(measured) - s * log(bound)``, where ``s``
  in [0, 1] is fitted to the measurements: a configuration far from anything measured still
  ranks by what is known about it, as much as the measurements trust the bound;
* each constraint as its relative violation (``<= 0`` holds); and, once a launch failed,
  whether a launch runs at all (+1 ran, -1 crashed or ran out of memory).

The next configuration maximises expected improvement over the best feasible posterior mean
(robust to timing noise) times the probability that every constraint holds and the run
succeeds. Trials in flight (``ray.max_concurrent > 1``) enter the acquisition as ``BATCH``
says (:mod:`autotune.search.batch`: kriging believer, fantasies or local penalization), so
parallel proposals spread out; the startup design counts them as started.

A Pareto search over two objectives (``study.search: pareto``) fits one GP per objective (the
decode-speed prior on decode speed) and proposes the configuration with the highest expected
hypervolume improvement over the posterior means of the measured-feasible front, exact in two
dimensions (:mod:`autotune.search.front`), times the same probability of feasibility; trials
in flight enter each GP at their posterior mean.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState
from scipy.stats import norm
from threadpoolctl import threadpool_limits

from autotune.search import batch as batchlib
from autotune.search import context
from autotune.search import design
from autotune.search import front as frontlib
from autotune.search import local
from autotune.search import memory
from autotune.search import refine
from autotune.search import turns
from autotune.search.design import config_key
from autotune.search.design import trial_keys
from autotune.search.design import trial_params
from autotune.search.pool import Pool
from autotune.search.space import encode
from autotune.search.subsample import candidate_rows
from autotune.search.subsample import train_rows
from autotune.search.trials import trial_attrs

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from autotune.objectives.goals import Constraint
    from autotune.search.space import Space

# The sampler's own cost stays flat as a study grows (bench/sampler_cost.py): a GP is fitted on
# at most MAX_TRAIN measured trials (the best, the best feasible, the rest spread at random);
# at most MAX_CANDIDATES free configurations are scored per ask (the highest-predicted ones,
# the neighbours of the best measured, the rest at random); past WARM_FROM trials a GP's
# hyperparameters are re-optimised only every REFIT_EVERY asks, from the last ones.
MAX_TRAIN = 200
# A trial stopped early (study.early_stop) is PRUNED with its partial numbers: it ran, its value
# and constraints are what it measured, so the GPs learn from it like any measured trial.
TOLD = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
RAN = ("ok", "stopped")
MAX_CANDIDATES = 25_000
WARM_FROM = 40
REFIT_EVERY = 5
# How trials in flight shape the next proposal (autotune.search.batch.MODES). On the tuning
# seeds of bench/slots.py the three tied within a trial or two (bench/results/slots.txt);
# fantasies are kept as the one that accounts for what the trials in flight may return.
BATCH = "fantasy"
# The GPs' length scales are bounded below by LENGTH_SCALE_MIN of a feature's range (issue 23).
# With ~15 measurements a free fit may explain a zigzag (timing noise, a crash or constraint
# edge) by a scale of 0.05, and then a configuration one step from anything measured is as
# unknown as one far away. Tune set (bench/efficiency.py --fast --tune: seeds 0-9 of exl2_70b,
# llamacpp_7b, vllm_h100 x none/physics/misleading), studies at 95% of the optimum by trial 20
# for a floor of 0.05 (before) / 0.2 / 0.4: 53/90, 57/90, 57/90; on exl2_70b's seeds 10-19 (a
# check outside both sets) 26/30, 25/30, 25/30: a small gain, not a sure one. 0.4 narrows the
# parallel proposals' spread (tests/search/test_bo_batch.py); 0.2 does not. Report-set figures
# and every variant tried: bench/results/robust.txt.
LENGTH_SCALE_MIN = 0.2
# A Pareto search's GPs keep the old floor: the front is a staircase of small steps (a VRAM
# step, a thread more), which a scale of 0.2 of the range smooths away. bench/pareto.py's tune
# seeds (0-9 of its four surfaces), studies at 90% of the true front's hypervolume by trial 20:
# 30/40 with a floor of 0.2, 33/40 with 0.05 (bench/results/pareto.txt).
PARETO_LENGTH_SCALE_MIN = 0.05
# Measured on the tune set and dropped, kept as bench/efficiency.py --variant knobs so the rows
# of bench/results/robust.txt ("Session 15") can be re-run: an upper bound on the length scales
# (1.0: 56/90 against 66/90), the objective's posterior sd scaled before expected improvement
# (0.5/0.75/1.5/2: 63, 65, 60, 54 of 90) and more restarts of the hyperparameter fit (6: 50/78
# against 58/78 on the same seeds, 1.8x the time).
LENGTH_SCALE_MAX = 20.0
SD_SCALE = 1.0
RESTARTS = 2
# A constraint whose metric the engine's prediction expects (the command engine's
# ``predict.expect``, e.g. perplexity by quant from llama.cpp's published table) is modelled as
# the measured violation less the expected one times its fitted trust, as the speed bound enters
# the objective's GP: an untried quant ranks by what the user's table says of its quality, as far
# as the measurements trust the table (a wrong table is trusted less, not followed). Session 27,
# bench/efficiency.py --fast --families (llamacpp_7b, llamacpp_noisy, cpu_7b, moe_30b, vllm_h100
# with a table in their physics and misleading priors), 20 launched trials, against EXPECT off:
# 340 paired studies (tune 1000-1027 and held-out 5000-5005, both priors) won 24 / lost 15 at 95%
# of the optimum by trial 20 (sign test p = 0.2), share at trial 20 +0.010 (Wilcoxon p = 0.009),
# mean share over trials 1-20 +0.023 (p < 0.001). The same table used by the startup design
# (configurations expected to break a bound ranked last) lost: 129 against 131 of 222 physics
# studies, with the constraint GPs too 126 (bench/results/robust.txt, session 27).
EXPECT = True
# A pool that samples its space grows around the REFINE best measured configurations at each
# ask (autotune.search.refine): a narrow optimum need not be among the sampled ones.
REFINE = 2


class _GP:
    """A fitted GP (and its kernel, to add trials in flight without refitting)."""

    def __init__(self, X: np.ndarray, y: np.ndarray, seed: int, pending: np.ndarray,
                 kernel: Any = None, optimize: bool = True, floor: float | None = None) -> None:
        """``kernel``: start from these hyperparameters (a warm start, no restarts), or keep
        them as they are when not ``optimize``; ``floor``: the length scales' lower bound
        (default ``LENGTH_SCALE_MIN``)."""
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel
        from sklearn.gaussian_process.kernels import Matern
        from sklearn.gaussian_process.kernels import WhiteKernel

        cold = kernel is None
        if cold:
            kernel = ConstantKernel(1.0, (1e-2, 1e2)) * Matern(
                length_scale=np.full(X.shape[1], 0.5), length_scale_bounds=(LENGTH_SCALE_MIN if floor is None else floor, LENGTH_SCALE_MAX),
                nu=2.5) + WhiteKernel(1e-2, (1e-5, 0.5))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a length scale at its bound is fine here
            self.fitted = GaussianProcessRegressor(
                kernel, normalize_y=True, n_restarts_optimizer=RESTARTS if cold else 0, random_state=seed,
                optimizer="fmin_l_bfgs_b" if cold or optimize else None).fit(X, y)
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
    configurations at random. A single-objective study tells the scalar the winner is chosen
    by; a two-objective study (a Pareto search) tells both objectives, named in ``objectives``
    in study order. The constraints' values are read from each trial's metrics.
    """

    def __init__(self, space: Space, pool_fn: Callable[[], Pool], constraints: list[Constraint],
                 seed: int | None = None, n_startup: int = 2, max_train: int = MAX_TRAIN,
                 max_candidates: int = MAX_CANDIDATES, batch: str | None = None,
                 refine: int | None = None, objectives: Sequence[str] = ()) -> None:
        self.objectives = list(objectives)  # what is told, in study order (record.optuna_study.told_names)
        self.batch = batch or BATCH
        if self.batch not in batchlib.MODES:
            raise ValueError(f"batch={self.batch!r}: expected one of {', '.join(batchlib.MODES)}")
        self.space = space
        self.constraints = constraints
        self.n_startup = n_startup
        self.max_train = max_train
        self.max_candidates = max_candidates
        self.refine = REFINE if refine is None else refine
        self.last_sizes: dict[str, int] = {}  # the last ask's training and candidate set sizes
        self._kernels: dict[str, Any] = {}  # each GP's last fitted hyperparameters
        self._asks = 0
        self._need: dict[str, int] = {}  # context knob -> tokens a failed launch named (autotune.search.context)
        self._pareto = False  # a Pareto search (set at each model ask from the study's directions)
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
        with threadpool_limits(1):  # small matrices: threaded BLAS only spins on a busy machine
            choice = self.choose(study)
        return {} if choice is None else {k: encode(v) for k, v in choice.items() if k in search_space}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def is_exhausted(self, study: optuna.Study) -> bool:
        """Every launchable configuration has been proposed and nothing enqueued is left
        (the driver then ends the study)."""
        trials = study.get_trials(deepcopy=False)
        return not any(t.state == TrialState.WAITING for t in trials) and not len(self._free(trial_keys(trials)))

    # ---- the choice ------------------------------------------------------------------
    def _free(self, keys: dict[int, str]) -> np.ndarray:
        """Pool rows of the configurations no trial has proposed yet and no context overflow
        seen rules out (:mod:`autotune.search.context`)."""
        pool = self.pool
        free = np.ones(len(pool.keys), dtype=bool)
        free[[pool.index[k] for k in set(keys.values()) if k in pool.index]] = False
        for knob, n in self._need.items():
            free &= ~context.ruled_out(pool.numbers(knob), n)
        return np.flatnonzero(free)

    def choose(self, study: optuna.Study) -> dict[str, Any] | None:
        """The free pool configuration with the highest acquisition (None: none is left)."""
        pool = self.pool
        trials = study.get_trials(deepcopy=False)
        keys = trial_keys(trials)
        if pool.space is not None:  # a sample: trials measured outside it (trial 0, the design) join it
            pool.grow([trial_params(t) for t in trials if keys[t.number] not in pool.index
                       and t.state in TOLD], measured=True)
        self._need = context.limits([(trial_params(t), trial_attrs(t).reason) for t in trials
                                     if t.state in TOLD and trial_attrs(t).status not in RAN])
        free = self._free(keys)
        if not len(free):
            return None
        row = {n: pool.index[k] for n, k in keys.items() if k in pool.index}  # trial -> pool row
        # a launch that failed before any succeeded is told FAIL (nothing to call worst yet)
        launched = [t for t in trials if t.state in TOLD
                    and trial_attrs(t).kind == "launched" and t.number in row]
        card = memory.card_gb(self.space.settings)  # a run at the card's limit spilled (memory.FULL)
        ok = [t for t in launched if trial_attrs(t).status in RAN and t.values and not memory.spilled(t, card)]
        rows_p = [row[t.number] for t in trials if t.state == TrialState.RUNNING and t.number in row]
        if len(launched) + len(rows_p) < self.n_startup or len(ok) < 2:
            return pool.params[int(self._rng.choice(free))]
        self._asks += 1
        pending = pool.X[rows_p]
        rows_ok = np.array([row[t.number] for t in ok])
        seed = int(self._rng.integers(2**31))
        feasible = np.array([all(v <= 0 for v in dict(t.constraints or {}).values()) for t in ok])
        failed = np.array([trial_attrs(t).status not in RAN for t in launched])
        self._pareto = len(study.directions) > 1
        if self._pareto:
            return self._choose_front(study, ok, launched, feasible, failed, row, pending, keys, seed)

        maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
        values = np.array([t.values[0] for t in ok], dtype=float)
        logged = bool(np.all(values > 0))
        y = (np.log(values) if logged else values) * (1.0 if maximize else -1.0)
        sel = train_rows(y, feasible, self.max_train, self._rng)
        sel_launched = train_rows(failed.astype(float), failed, self.max_train, self._rng)
        best_rows = rows_ok[np.argsort(-np.where(feasible, y, y - 1e9))[:4]]
        if pool.space is not None and self.refine:
            for r in best_rows[: self.refine]:
                pool.grow(refine.neighbours(pool.space, pool.params[r]))
            free = self._free(keys)
        prior = self.prior(0, rows_ok, y, logged and maximize)
        centres = rows_ok[np.argsort(-y)][feasible[np.argsort(-y)]][: local.CENTRES]
        lines = turns.lines(pool, self.space, centres) if local.turn(self._asks) else []
        cover = turns.cover_rows(pool, self.space, trials, self._rng) if design.COVER_LAZY and self._asks % 2 == 1 else []
        free = self._free(keys)
        cand = free[candidate_rows(pool.X, free, pool.log_bound, best_rows, self.max_candidates, self._rng)]
        extra = [r for r in [*(pool.index.get(config_key(c)) for c in lines), *cover] if r is not None]
        cand = np.unique(np.concatenate([cand, np.intersect1d(np.array(extra, dtype=int), free)])).astype(int)
        self.last_sizes = {"train": len(sel), "candidates": len(cand)}
        Xc = pool.X[cand]

        rows_s = rows_ok[sel]
        believe = pending if self.batch == "believer" else pending[:0]
        gp = self._gp("objective", pool.X[rows_s], y[sel] - prior[rows_s], seed, believe)
        mu, sd = gp.predict(Xc)
        mu, sd = mu + prior[cand], sd * SD_SCALE
        log_pf = self._log_p_feasible([ok[i] for i in sel], [launched[i] for i in sel_launched],
                                      row, pending, np.concatenate([cand, rows_p]).astype(int), seed)
        log_pf, log_pf_p = log_pf[: len(Xc)], log_pf[len(Xc):]
        if not feasible.any():  # nothing feasible yet: the likeliest feasible, faster first
            likely = log_pf + 1e-3 * mu
            shown = turns.pick(cand, likely, cover)  # a level still missing is shown all the same
            return pool.params[int(shown if shown is not None else cand[np.argmax(likely)])]
        best = float(np.max((gp.fitted.predict(pool.X[rows_s]) + prior[rows_s])[feasible[sel]]))
        if not len(rows_p) or self.batch == "believer":
            acq = batchlib.log_ei(mu, sd, best)
        elif self.batch == "fantasy":
            acq = batchlib.fantasy_log_ei(gp.fitted, pending, prior[rows_p], np.exp(log_pf_p), Xc,
                                          prior[cand], best, self._rng)
        else:
            mu_p, sd_p = gp.predict(pending)
            scale = batchlib.length_scale(gp.fitted.kernel_, pool.X.shape[1])
            acq = batchlib.log_ei(mu, sd, best) + batchlib.log_penalty(
                Xc, mu, pending, mu_p + prior[rows_p], sd_p, best, scale, self._rng)
        score = acq + log_pf
        turn = turns.turn(pool, self.space, cand, score, cover, centres, lines, gp, prior, keys, trials, y, feasible,
                          rows_ok, np.exp(log_pf), logged)
        return pool.params[int(turn if turn is not None else cand[np.argmax(score)])]

    def _choose_front(self, study: optuna.Study, ok: list[FrozenTrial], launched: list[FrozenTrial],
                      feasible: np.ndarray, failed: np.ndarray, row: dict[int, int], pending: np.ndarray,
                      keys: dict[int, str], seed: int) -> dict[str, Any] | None:
        """A Pareto search over two objectives: the free configuration with the highest
        expected hypervolume improvement (:mod:`autotune.search.front`) over the posterior
        means of the measured-feasible front, times the probability that it is feasible.
        Trials in flight enter each GP at their posterior mean (kriging believer)."""
        pool = self.pool
        rows_ok = np.array([row[t.number] for t in ok])
        directions = [d == optuna.study.StudyDirection.MAXIMIZE for d in study.directions]
        values = np.array([t.values for t in ok], dtype=float)
        logged = np.all(values > 0, axis=0)
        Y = np.where(logged, np.log(np.where(values > 0, values, 1.0)), values) * np.where(directions, 1.0, -1.0)
        on_front = rows_ok[_front_rows(Y, feasible)]
        if pool.space is not None and self.refine:
            ends = list(dict.fromkeys([*on_front[:1], *on_front[-1:]]))  # the front's two ends
            for r in ends[: self.refine]:
                pool.grow(refine.neighbours(pool.space, pool.params[r]))
        priors = [self.prior(j, rows_ok, Y[:, j], logged[j] and maximize) for j, maximize in enumerate(directions)]
        free = self._free(keys)
        if not len(free):
            return None
        cand = free[candidate_rows(pool.X, free, pool.log_bound, on_front, self.max_candidates, self._rng)]
        Xc = pool.X[cand]
        sel = train_rows(Y.sum(axis=1), feasible, self.max_train, self._rng)
        rows_s = rows_ok[sel]
        mu, sd, front = np.zeros((len(cand), 2)), np.ones((len(cand), 2)), np.zeros((int(feasible.sum()), 2))
        for j in range(Y.shape[1]):
            gp = self._gp(f"objective{j}", pool.X[rows_s], Y[sel, j] - priors[j][rows_s], seed, pending)
            m, s = gp.predict(Xc)
            mu[:, j], sd[:, j] = m + priors[j][cand], s
            if feasible.any():
                front[:, j] = gp.fitted.predict(pool.X[rows_ok[feasible]]) + priors[j][rows_ok[feasible]]
        sel_launched = train_rows(failed.astype(float), failed, self.max_train, self._rng)
        log_pf = self._log_p_feasible([ok[i] for i in sel], [launched[i] for i in sel_launched],
                                      row, pending, cand, seed)
        self.last_sizes = {"train": len(sel), "candidates": len(cand)}
        if not len(front):  # nothing feasible yet: the likeliest feasible, better first
            return pool.params[int(cand[np.argmax(log_pf + 1e-3 * mu.sum(axis=1))])]
        acq = frontlib.log_ehvi(mu, sd, front, frontlib.reference(front, span=np.ptp(Y, axis=0)))
        return pool.params[int(cand[np.argmax(acq + log_pf)])]

    def constraint_prior(self, c: Constraint, rows: np.ndarray, z: np.ndarray) -> np.ndarray:
        """The prior mean of constraint ``c``'s GP over the pool, in bound units: the violation
        the engine's prediction expects (:meth:`Pool.expected`), times its fitted trust against
        the measured ``z`` at pool ``rows`` (:func:`_trusted_prior`); zero where nothing is
        expected (or ``EXPECT`` is off)."""
        expected = self.pool.expected(c.metric) if EXPECT else None
        if expected is None or not np.all(np.isfinite(expected)):
            return np.zeros(len(self.pool.keys))
        zp = c.violation(expected) / max(abs(c.bound), 1e-9)  # elementwise
        if np.ptp(zp[rows]) < 1e-9:  # the measured rows cannot tell a slope: the table as it is
            return zp
        return _trusted_prior(zp, rows, z)

    def prior(self, j: int, rows: np.ndarray, y: np.ndarray, log_speed: bool) -> np.ndarray:
        """The prior mean of told value ``j``'s GP over the pool: the trusted decode-speed bound
        (:func:`_trusted_prior`) when the value is ``decode_tps`` on a log scale (``log_speed``)
        and the pool has bounds, else zero. A bound on decode speed says little about goodput
        or TTFT, so it is no prior for them."""
        pool = self.pool
        if pool.log_bound is None or not log_speed or self.objectives[j:j + 1] != ["decode_tps"]:
            return np.zeros(len(pool.keys))
        return _trusted_prior(pool.log_bound, rows, y)

    def _gp(self, name: str, X: np.ndarray, y: np.ndarray, seed: int, pending: np.ndarray) -> _GP:
        """A GP for ``name``: past WARM_FROM trials warm-started from its last hyperparameters,
        re-optimised every REFIT_EVERY asks and kept as they are in between."""
        kernel = self._kernels.get(name) if len(y) > WARM_FROM else None
        gp = _GP(X, y, seed, pending, kernel, optimize=self._asks % REFIT_EVERY == 0,
                 floor=PARETO_LENGTH_SCALE_MIN if self._pareto else None)
        self._kernels[name] = gp.fitted.kernel_
        return gp

    def _log_p_feasible(self, ok: list[FrozenTrial], launched: list[FrozenTrial], row: dict[int, int],
                        pending: np.ndarray, rows_f: np.ndarray, seed: int) -> np.ndarray:
        """log P(every constraint holds and the run succeeds) per candidate configuration (pool
        rows ``rows_f``)."""
        Xf = self.pool.X[rows_f]
        out = np.zeros(len(Xf))
        fits, launched = memory.split(ok, launched, row, self.pool.X, Xf, self.space.settings, seed)
        out += 0.0 if fits is None else fits
        if self._need:  # a context overflow is a rule on the free rows, not a "does it run" point
            launched = [t for t in launched if not context.explained(trial_params(t), trial_attrs(t).reason)]
        for c in (c for c in self.constraints if c.known):  # a relative bound set by trial 0
            seen = [(row[t.number], trial_attrs(t).metrics[c.metric])
                    for t in ok if c.metric in trial_attrs(t).metrics]
            z = np.array([c.violation(v) / max(abs(c.bound), 1e-9) for _, v in seen])
            if len(seen) < 2 or np.all(z < -0.5):
                continue  # too few values, or far inside its bound everywhere measured
            rows_seen = np.array([r for r, _ in seen])
            prior = self.constraint_prior(c, rows_seen, z)
            mu, sd = self._gp(str(c), self.pool.X[rows_seen], z - prior[rows_seen], seed, pending).predict(Xf)
            out += norm.logcdf(-(mu + prior[rows_f]) / sd)
        if any(trial_attrs(t).status not in RAN for t in launched):
            ran = np.array([1.0 if trial_attrs(t).status in RAN else -1.0 for t in launched])
            X = self.pool.X[[row[t.number] for t in launched]]
            mu, sd = self._gp("runs", X, ran, seed, pending).predict(Xf)
            out += norm.logcdf(mu / sd)
        return out


def _front_rows(Y: np.ndarray, feasible: np.ndarray) -> np.ndarray:
    """Indices of the feasible rows of ``Y`` (every column maximised) that no other feasible row
    dominates, by the first column, best first."""
    idx = np.flatnonzero(feasible)
    keep = idx[frontlib.nondominated_rows(Y[idx])]
    return np.array(sorted(keep, key=lambda i: -Y[i, 0]), dtype=int)


def _trusted_prior(log_bound: np.ndarray, rows: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The prior mean of a log-speed GP (or of a constraint's, in bound units): the pool's log
    bound (expected violation) times its fitted slope against the measured ``y`` at pool
    ``rows``, clipped to [0, 1] (how far the measurements trust it)."""
    trust = np.linalg.lstsq(np.vstack([log_bound[rows], np.ones(len(rows))]).T, y, rcond=None)[0][0]
    return float(np.clip(trust, 0.0, 1.0)) * log_bound
