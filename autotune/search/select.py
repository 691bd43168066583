"""Winner selection among feasible Pareto trials: ``max`` one metric, ``knee``, or ``weighted``.

Pure functions over :class:`~autotune.search.trials.Record` (number, params, metrics),
tested table-first. The driver re-measures the top candidates side by side and calls :func:`rank` again on the
re-measured numbers, so noise in the search cannot pick the winner. :func:`search_scalar`
is the one number the default search (``study.search: single``) optimises: the metric
the winner is chosen by, or a scale-free scalarisation of the metrics ``knee``/``weighted`` read.
"""

from __future__ import annotations

import math

from autotune.objectives import get_metric
from autotune.search.trials import Record


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


def _uses(rule: str, metric: str, objectives: list[str], weights: dict[str, float]) -> list[str]:
    """The metrics a selection rule reads."""
    return {"max": [metric], "knee": list(objectives)}.get(rule, list(weights))


def rank(records: list[Record], rule: str, metric: str, objectives: list[str], weights: dict[str, float]) -> list[Record]:
    """Order candidates best-first under the selection rule; ties go to the earlier trial.

    A record without a finite value for a metric the rule reads ranks after every record
    that has them all.
    """
    if rule not in ("max", "knee", "weighted"):
        raise ValueError(f"unknown selection rule {rule!r}")
    used = _uses(rule, metric, objectives, weights)
    complete = [r for r in records if all(math.isfinite(r.metrics.get(m, math.nan)) for m in used)]
    rest = sorted((r for r in records if r not in complete), key=lambda r: r.number)
    if not complete:
        return rest
    if rule == "max":
        sign = -1.0 if get_metric(metric).higher_is_better else 1.0
        return sorted(complete, key=lambda r: (sign * r.metrics[metric], r.number)) + rest
    if rule == "knee":
        norms = [_norm(complete, o) for o in objectives]
        dist = {r.number: math.sqrt(sum((1.0 - n[r.number]) ** 2 for n in norms)) for r in complete}
        return sorted(complete, key=lambda r: (dist[r.number], r.number)) + rest
    total = sum(abs(w) for w in weights.values()) or 1.0
    norms = {m: _norm(complete, m) for m in weights}
    score = {r.number: sum(w * norms[m][r.number] for m, w in weights.items()) / total for r in complete}
    return sorted(complete, key=lambda r: (-score[r.number], r.number)) + rest


def pareto_front(records: list[Record], objectives: list[str]) -> list[Record]:
    """Non-dominated feasible records (all objectives finite)."""
    dirs = [get_metric(o) for o in objectives]
    pts = [r for r in records if r.feasible and all(math.isfinite(r.metrics.get(o, math.nan)) for o in objectives)]

    def dominates(a: Record, b: Record) -> bool:
        better_or_eq = all(not m.better(b.metrics[m.name], a.metrics[m.name]) for m in dirs)
        strictly = any(m.better(a.metrics[m.name], b.metrics[m.name]) for m in dirs)
        return better_or_eq and strictly

    return [a for a in pts if not any(dominates(b, a) for b in pts if b is not a)]


def _slog(value: float) -> float:
    """Signed log: scale-free for large values, linear around 0, defined for negatives."""
    return math.copysign(math.log1p(abs(value)), value)


def search_direction(rule: str, metric: str) -> str:
    """Direction of :func:`search_scalar`: the metric's own for ``max``, else maximize."""
    return get_metric(metric).direction if rule == "max" else "maximize"


def search_scalar(metrics: dict[str, float], rule: str, metric: str, objectives: list[str],
                  weights: dict[str, float]) -> float | None:
    """The value the single-objective search optimises, or None if a metric it reads is missing.

    ``max``: the metric itself. ``weighted``: sum of ``weight * signed log(value)`` with the
    sign of each metric's direction (better is higher), over the sum of |weights|. ``knee``:
    the same with equal weights over the objectives (a balanced, scale-free trade-off).
    """
    used = _uses(rule, metric, objectives, weights)
    vals = {m: metrics.get(m, math.nan) for m in used}
    if not all(math.isfinite(v) for v in vals.values()):
        return None
    if rule == "max":
        return vals[metric]
    w = weights if rule == "weighted" else {m: 1.0 for m in objectives}
    total = sum(abs(x) for x in w.values()) or 1.0
    sign = {m: 1.0 if get_metric(m).higher_is_better else -1.0 for m in w}
    return sum(w[m] * sign[m] * _slog(vals[m]) for m in w) / total
