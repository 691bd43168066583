"""Shared by the sampler tests: bo driven as the driver drives it, on a real in-memory Optuna study."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna
import pytest

from autotune.config.validate import compile_space
from autotune.record import optuna_study as studylib
from autotune.search.bo import PoolSampler
from autotune.search.pool import build_pool
from autotune.trial.spec import TrialResult


def run_bo(cfg: Any, result_of: Callable[[dict, int], TrialResult], start: list[dict], seed: int,
           n: int = 14) -> list[tuple[dict, TrialResult]]:
    """``n`` trials of ``bo`` (``start`` enqueued first, as the startup design is), each told
    through :func:`autotune.record.optuna_study.tell` (the driver's path): (params, result) in order."""
    space = compile_space(cfg)
    sampler = PoolSampler(space, lambda: build_pool(space, lambda p: (True, None), seed), cfg.constraints,
                          seed, 3, objectives=studylib.told_names(cfg))
    study = optuna.create_study(directions=studylib.directions(cfg), sampler=sampler)
    out = []
    for i in range(n):
        if i < len(start):
            study.enqueue_trial(start[i])
        trial = study.ask()
        p = space.suggest(trial)
        result = result_of(p, trial.number)
        studylib.tell(study, trial, cfg, p, result)
        out.append((p, result))
    return out


@pytest.fixture
def bo_run() -> Callable[..., list[tuple[dict, TrialResult]]]:
    return run_bo
