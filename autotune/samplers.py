"""Optuna samplers chosen in config: tpe (default), gp, nsga2, random, grid.

TPE is multivariate with ``group=True`` (conditional spaces) and ``constant_liar=True`` so
trials in flight push parallel proposals apart. Constraints reach every sampler through
``trial.set_constraint`` (Optuna 5); no ``constraints_func`` is passed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import warnings

import optuna

from autotune.errors import ConfigError

if TYPE_CHECKING:
    from autotune.space import Space


def make_sampler(name: str, seed: int | None, space: Space, n_trials: int) -> optuna.samplers.BaseSampler:
    """Build the sampler named in ``study.sampler``."""
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    startup = max(4, min(10, n_trials // 3))
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=True, constant_liar=True,
            n_startup_trials=startup,
        )
    if name == "gp":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ConfigError("study.sampler", name, "the GP sampler needs torch: pip install torch (or use tpe)") from None
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup, warn_independent_sampling=False)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(20, n_trials // 3)))
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        if any(p.when is not None for p in space.params.values()):
            raise ConfigError("study.sampler", name, "the grid sampler cannot search conditional parameters (when:); use tpe")
        return optuna.samplers.GridSampler(space.grid(), seed=seed)
    raise ConfigError("study.sampler", name, "expected one of tpe, gp, nsga2, random, grid")
