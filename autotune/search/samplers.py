"""Optuna samplers chosen in config: auto (default), bo, tpe, gp, nsga2, random, grid.

``auto`` is ``bo`` for a single-objective search (``study.search: single``) and for a Pareto
search over two objectives, and Optuna's ``GPSampler`` for three objectives or more (TPE when
torch is not installed). ``bo`` (:mod:`autotune.search.bo`) scores only configurations that can
launch and uses the engine's speed prediction as its prior; on the bench surfaces
(bench/efficiency.py) it reached 95% of the optimum in fewer trials than TPE and Optuna's GP.
Its Pareto search proposes by the exact expected hypervolume improvement of the measured
feasible front times P(feasible) (:mod:`autotune.search.front`); on the bench surfaces
(bench/results/pareto.txt, report seeds) it reached 90% of the true feasible front's
hypervolume by trial 20 in 80% of studies, GPSampler (constrained LogEHVI) in 68%, TPE in 56%,
random in 21%.

TPE is multivariate with ``group=True`` (conditional spaces) and ``constant_liar=True`` so
trials in flight push parallel proposals apart. Constraints reach every sampler through
``trial.set_constraint`` (Optuna 5); no ``constraints_func`` is passed. bo, TPE and GP model
from the first trial after the startup design (:mod:`autotune.search.design`), which replaces
their random startup trials; ``random`` and ``grid`` get no design.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from collections.abc import Sequence
from typing import TYPE_CHECKING

import optuna

from autotune.errors import ConfigError

if TYPE_CHECKING:
    from autotune.objectives.goals import Constraint
    from autotune.search.pool import Pool
    from autotune.search.space import Space


class AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler for an ask/tell loop: Optuna's calls ``study.stop()`` once the grid is
    exhausted, which raises outside ``study.optimize``. The driver's budget ends the study
    instead; :meth:`is_exhausted` says when every grid point has been visited.
    """

    def after_trial(self, study, trial, state, values) -> None:
        return None


def torch_available() -> bool:
    """Whether ``import torch`` would work (without importing it)."""
    return importlib.util.find_spec("torch") is not None


def resolve(name: str, search: str = "single", n_objectives: int = 2) -> str:
    """The sampler ``study.sampler`` names; ``auto`` is bo (a single search, or a Pareto search
    over two objectives) or, for three objectives or more, gp (tpe when torch, which Optuna's
    GPSampler needs, is not installed)."""
    if name != "auto":
        return name
    if search == "single" or n_objectives <= 2:
        return "bo"
    return "gp" if torch_available() else "tpe"


def validate_sampler(name: str, space: Space, search: str = "single", n_objectives: int = 2) -> None:
    """Refuse, before anything is written, a sampler that cannot search ``space``."""
    name = resolve(name, search, n_objectives)
    if name == "gp" and not torch_available():
        raise ConfigError("study.sampler", name, "the GP sampler needs torch, which is not installed",
                          "Install it (pip install torch==2.13.0) or use sampler tpe")
    if name == "bo" and search == "pareto" and n_objectives > 2:
        raise ConfigError("study.sampler", name, f"bo's Pareto search takes two objectives, not {n_objectives}",
                          "Use sampler gp, tpe or nsga2 for three objectives or more")
    if name == "grid":
        conditional = [p.name for p in space.params.values() if p.when is not None]
        if conditional:
            raise ConfigError("study.sampler", name, f"the grid sampler cannot search conditional "
                              f"parameters (space.{conditional[0]}.when); use tpe or random")
        space.grid()  # a continuous dimension raises with its path


def uses_design(name: str) -> bool:
    """Whether the sampler starts from the space-filling design (model-based samplers)."""
    return name in ("auto", "bo", "tpe", "gp")


def make_sampler(name: str, seed: int | None, space: Space, n_trials: int,
                 n_startup: int | None = None, search: str = "single",
                 pool: Callable[[], Pool] | None = None,
                 constraints: Sequence[Constraint] = (),
                 objectives: Sequence[str] = ()) -> optuna.samplers.BaseSampler:
    """Build the sampler named in ``study.sampler``; ``n_startup`` trials precede its model.

    ``pool`` builds bo's pool of launchable configurations (default: rules and the engine's
    check only, no prediction); ``constraints`` are the study's, which bo models.
    """
    name = resolve(name, search, max(len(objectives), 1))
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    startup = max(4, min(10, n_trials // 3)) if n_startup is None else n_startup
    validate_sampler(name, space, search, max(len(objectives), 1))
    if name == "bo":
        from autotune.search.bo import PoolSampler
        from autotune.search.pool import build_pool
        from autotune.search.pool import uses_order

        def default() -> Pool:
            return build_pool(space, lambda _p: (True, None), seed, ordered=uses_order(search))

        return PoolSampler(space, pool or default, list(constraints), seed, n_startup=startup, objectives=objectives)
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=True, constant_liar=True,
            n_startup_trials=startup,
        )
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup, warn_independent_sampling=False)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(20, n_trials // 3)))
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return AskTellGridSampler(space.grid(), seed=seed)
    raise ConfigError("study.sampler", name, "expected one of auto, bo, tpe, gp, nsga2, random, grid")
