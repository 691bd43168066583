"""Metrics, objectives and constraints: name, unit, direction and how each is computed."""

from __future__ import annotations

from autotune.objectives import builtin  # noqa: F401  (registers the built-in metrics)
from autotune.objectives import headroom  # noqa: F401  (roofline share, energy per token)
from autotune.objectives import serving  # noqa: F401  (serving, load and multi-turn metrics)
from autotune.objectives._registry import Direction
from autotune.objectives._registry import Metric
from autotune.objectives._registry import all_metrics
from autotune.objectives._registry import get_metric
from autotune.objectives._registry import register_distribution
from autotune.objectives._registry import register_metric
from autotune.objectives.goals import Constraint
from autotune.objectives.goals import Objective

__all__ = [
    "Constraint",
    "Direction",
    "Metric",
    "Objective",
    "all_metrics",
    "get_metric",
    "register_distribution",
    "register_metric",
]
