"""The metric registry: each metric is declared once with its unit and direction.

Optuna study directions, constraint signs and report columns are all derived from here.
A user adds a metric by calling :func:`register_metric` (for example in a module listed
under ``objectives_modules`` in the config); the driver never names a metric itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from autotune.errors import unknown_name

Direction = Literal["maximize", "minimize"]


@dataclass(frozen=True)
class Metric:
    """One measured quantity.

    Attributes:
        name: key in a trial's metrics (``ttft_p95_ms``).
        unit: display unit (``ms``, ``tok/s``, ``%``).
        direction: whether bigger is better (``maximize``) or smaller (``minimize``).
        description: how it is computed, shown in reports and docs.
    """

    name: str
    unit: str
    direction: Direction
    description: str

    @property
    def higher_is_better(self) -> bool:
        return self.direction == "maximize"

    def worst(self, a: float, b: float) -> float:
        """The worse of two values under this metric's direction."""
        return min(a, b) if self.higher_is_better else max(a, b)

    def better(self, a: float, b: float) -> bool:
        """True if ``a`` is strictly better than ``b``."""
        return a > b if self.higher_is_better else a < b

    def speedup(self, value: float | None, base: float | None) -> float | None:
        """How many times better ``value`` is than ``base`` (the winner over the baseline: the
        one speed-up every report shows); None when either is missing, zero or not finite."""
        if not value or not base or not math.isfinite(value) or not math.isfinite(base):
            return None
        return value / base if self.higher_is_better else base / value


_REGISTRY: dict[str, Metric] = {}


def register_metric(name: str, unit: str, direction: Direction, description: str) -> Metric:
    """Register a metric (idempotent for an identical declaration)."""
    if direction not in ("maximize", "minimize"):
        raise ValueError(f"metric {name!r}: direction must be maximize or minimize, got {direction!r}")
    metric = Metric(name, unit, direction, description)
    old = _REGISTRY.get(name)
    if old is not None and old != metric:
        raise ValueError(f"metric {name!r} is already registered differently: {old}")
    _REGISTRY[name] = metric
    return metric


def register_distribution(
    base: str, unit: str, direction: Direction, description: str, stats=("p50", "p95", "p99")
) -> list[Metric]:
    """Register ``{base}_{stat}_{unit}`` for each percentile plus ``{base}_mad_{unit}``.

    ``register_distribution("ttft", "ms", "minimize", ...)`` gives ``ttft_p50_ms``,
    ``ttft_p95_ms``, ``ttft_p99_ms`` and ``ttft_mad_ms`` (median absolute deviation).
    """
    out = [
        register_metric(f"{base}_{s}_{unit}", unit, direction, f"{description} ({s} over repeats)")
        for s in stats
    ]
    out.append(
        register_metric(
            f"{base}_mad_{unit}", unit, "minimize", f"{description} (median absolute deviation)"
        )
    )
    return out


def get_metric(name: str, path: str = "metric") -> Metric:
    """Look a metric up; unknown names raise a ConfigError with a suggestion."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise unknown_name(path, name, _REGISTRY, "metric") from None


def all_metrics() -> dict[str, Metric]:
    """A copy of the registry."""
    return dict(_REGISTRY)
