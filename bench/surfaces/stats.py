"""Statistics for bench/efficiency.py: medians, Wilson intervals, quartiles, issue 23's targets."""

from __future__ import annotations

import math
import statistics


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def wilson(hits: int, n: int) -> tuple[float, float]:
    """The Wilson 95% interval of a share of ``hits`` in ``n`` seeds (scipy)."""
    from scipy.stats import binomtest

    if n == 0:
        return (math.nan, math.nan)
    ci = binomtest(hits, n).proportion_ci(confidence_level=0.95, method="wilson")
    return (float(ci.low), float(ci.high))


def _quartiles(values: list[float]) -> tuple[float, float]:
    """Lower and upper quartile (inclusive method; inf where a seed never got there)."""
    if len(values) < 2:
        return (values[0], values[0]) if values else (math.nan, math.nan)
    v = sorted(values)

    def q(f: float) -> float:
        x = f * (len(v) - 1)
        lo, hi, f = v[math.floor(x)], v[math.ceil(x)], x - math.floor(x)
        return lo if f == 0 or lo == hi else math.inf if math.isinf(hi) else lo + (hi - lo) * f
    return (q(0.25), q(0.75))


def _n(x: float) -> str:
    return ">budget" if math.isinf(x) else f"{x:g}"


MIN_SEEDS = 10


def verdicts(rows: list[dict]) -> list[str]:
    """Issue 23's targets for the default on each surface x set, against measured random. A row
    of fewer than ``MIN_SEEDS`` seeds (a spot check through the CLI) is not judged: its share
    says nothing about a target."""
    out = []
    by = {(r["surface"], r["set"], r["mode"], r["method"], r["via"]): r for r in rows}
    for (surface, set_, mode, method, via), r in by.items():
        if method != "default" or r["seeds"] < MIN_SEEDS:
            continue
        rnd = by.get((surface, set_, mode, "random", via))
        target = {"none": 0.80, "physics": 0.95}.get(mode)
        if mode == "misleading":
            none = by.get((surface, set_, "none", "default", via))
            target = max(0.0, none["reach95_by20"] - 0.10) if none else None
        hit = r["reach95_by20"]
        line = f"{surface:15s} {set_:6s} {mode:10s} {via:4s} default 95% by 20: {hit:4.0%}"
        if target is not None:
            line += f" (target {target:.0%}: {'met' if hit >= target - 1e-9 else f'missed by {target - hit:.0%}'})"
        if rnd:
            d, x = r["median_trials95"], rnd["median_trials95"]
            ratio = "no ratio (the default's median is beyond its budget)" if math.isinf(d) else (
                f">= {rnd['launched'] / d:.1f}x fewer (random's median beyond its {rnd['launched']:g})"
                if math.isinf(x) else f"{x / d:.1f}x fewer")
            line += f"; median trials to 95% {_n(d)} vs measured random {_n(x)}: {ratio} (target 3x)"
        out.append(line)
    return out
