"""Trial specs and results, the isolated runner, and the worker entry point."""

from __future__ import annotations

from autotune.trial.runner import run_trial
from autotune.trial.spec import TrialResult
from autotune.trial.spec import TrialSpec

__all__ = ["TrialResult", "TrialSpec", "run_trial"]
