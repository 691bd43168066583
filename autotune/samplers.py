"""Optuna samplers chosen in config: auto (default), tpe, gp, nsga2, random, grid.

``auto`` is GP for a single-objective search (``study.search: single``) when torch is
installed, else TPE (one note says so): on the bench surfaces (bench/efficiency.py) GP after
the startup design reached 95% of the optimum by 20 trials in more seeds than TPE.

TPE is multivariate with ``group=True`` (conditional spaces) and ``constant_liar=True`` so
trials in flight push parallel proposals apart. Constraints reach every sampler through
``trial.set_constraint`` (Optuna 5); no ``constraints_func`` is passed. TPE and GP model
from the first trial after the startup design (:mod:`autotune.design`), which replaces
their random startup trials; ``random`` and ``grid`` get no design.
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import TYPE_CHECKING

import optuna

from autotune.errors import ConfigError

if TYPE_CHECKING:
    from autotune.space import Space


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


def resolve(name: str, search: str = "single", has_torch: bool | None = None) -> str:
    """The sampler ``study.sampler`` names; ``auto`` is gp (single search, torch present) or tpe.

    ``has_torch`` defaults to whether torch is installed here.
    """
    if name != "auto":
        return name
    has_torch = torch_available() if has_torch is None else has_torch
    return "gp" if search == "single" and has_torch else "tpe"


def auto_note(name: str, search: str = "single", has_torch: bool | None = None) -> str | None:
    """One line when ``auto`` falls back to TPE because torch is missing (None otherwise)."""
    if name == "auto" and resolve(name, search, has_torch) == "tpe" and search == "single":
        return "study.sampler=auto: torch is not installed, so TPE searches (GP needs pip install torch==2.13.0)"
    return None


def validate_sampler(name: str, space: Space) -> None:
    """Refuse, before anything is written, a sampler that cannot search ``space``."""
    if name == "gp" and not torch_available():
        raise ConfigError("study.sampler", name, "the GP sampler needs torch, which is not installed",
                          "Install it (pip install torch==2.13.0) or use sampler tpe")
    if name == "grid":
        conditional = [p.name for p in space.params.values() if p.when is not None]
        if conditional:
            raise ConfigError("study.sampler", name, f"the grid sampler cannot search conditional "
                              f"parameters (space.{conditional[0]}.when); use tpe or random")
        space.grid()  # a continuous dimension raises with its path


def uses_design(name: str) -> bool:
    """Whether the sampler starts from the space-filling design (model-based samplers)."""
    return name in ("auto", "tpe", "gp")


def make_sampler(name: str, seed: int | None, space: Space, n_trials: int,
                 n_startup: int | None = None, search: str = "single",
                 has_torch: bool | None = None) -> optuna.samplers.BaseSampler:
    """Build the sampler named in ``study.sampler``; ``n_startup`` trials precede its model."""
    name = resolve(name, search, has_torch)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    startup = max(4, min(10, n_trials // 3)) if n_startup is None else n_startup
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=True, constant_liar=True,
            n_startup_trials=startup,
        )
    validate_sampler(name, space)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup, warn_independent_sampling=False)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(20, n_trials // 3)))
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return AskTellGridSampler(space.grid(), seed=seed)
    raise ConfigError("study.sampler", name, "expected one of auto, tpe, gp, nsga2, random, grid")
