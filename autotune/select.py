"""Winner selection among feasible Pareto trials: ``max`` one metric, ``knee``, or ``weighted``.

Pure functions over :class:`Record` (number, params, metrics), tested table-first. The
driver re-measures the top candidates side by side and calls :func:`rank` again on the
re-measured numbers, so noise in the search cannot pick the winner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from objectives import get_metric


@dataclass(frozen=True)
class Record:
    """A finished trial as the exporter and selector see it."""

    number: int
    params: dict[str, Any]
    metrics: dict[str, float]
    status: str = "ok"
    feasible: bool = True
    reason: str = ""
    violations: dict[str, float] = field(default_factory=dict)


def _norm(records: list[Record], metric: str) -> dict[int, float]:
    """Scale a metric to [0, 1] over the records, 1 = best under its direction."""
    m = get_metric(metric)
    vals = {r.number: r.metrics.get(metric, math.nan) for r in records}
    finite = [v for v in vals.values() if math.isfinite(v)]
    if not finite:
        return {n: 0.0 for n in vals}
    lo, hi = min(finite), max(finite)
    span = hi - lo or 1.0
    out = {}
    for n, v in vals.items():
        if not math.isfinite(v):
            out[n] = 0.0
        else:
            x = (v - lo) / span
            out[n] = x if m.higher_is_better else 1.0 - x
    return out


def rank(records: list[Record], rule: str, metric: str, objectives: list[str], weights: dict[str, float]) -> list[Record]:
    """Order candidates best-first under the selection rule."""
    if not records:
        return []
    if rule == "max":
        m = get_metric(metric)
        sign = -1.0 if m.higher_is_better else 1.0
        return sorted(records, key=lambda r: (sign * r.metrics.get(metric, -sign * math.inf), r.number))
    if rule == "knee":
        norms = [_norm(records, o) for o in objectives]
        dist = {r.number: math.sqrt(sum((1.0 - n[r.number]) ** 2 for n in norms)) for r in records}
        return sorted(records, key=lambda r: (dist[r.number], r.number))
    if rule == "weighted":
        total = sum(abs(w) for w in weights.values()) or 1.0
        norms = {m: _norm(records, m) for m in weights}
        score = {r.number: sum(w * norms[m][r.number] for m, w in weights.items()) / total for r in records}
        return sorted(records, key=lambda r: (-score[r.number], r.number))
    raise ValueError(f"unknown selection rule {rule!r}")


def pareto_front(records: list[Record], objectives: list[str]) -> list[Record]:
    """Non-dominated feasible records (all objectives finite)."""
    dirs = [get_metric(o) for o in objectives]
    pts = [r for r in records if r.feasible and all(math.isfinite(r.metrics.get(o, math.nan)) for o in objectives)]

    def dominates(a: Record, b: Record) -> bool:
        better_or_eq = all(not m.better(b.metrics[m.name], a.metrics[m.name]) for m in dirs)
        strictly = any(m.better(a.metrics[m.name], b.metrics[m.name]) for m in dirs)
        return better_or_eq and strictly

    return [a for a in pts if not any(dominates(b, a) for b in pts if b is not a)]
