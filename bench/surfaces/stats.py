"""Statistics for bench/efficiency.py and bench/pareto.py: medians, Wilson intervals, quartiles,
side-by-side counts on paired seeds, issue 23's targets."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable


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


def side_by_side(hits: dict[tuple, bool], base: str = "default",
                 total_by: Callable[[tuple], str] = lambda cell: "") -> list[str]:
    """Methods compared seed by seed: ``hits`` maps (cell, method, seed) to whether that study
    reached the target (``cell``: a tuple of labels, e.g. surface and prior mode). One line per
    cell with, for every other method run on the same seeds, ``won/lost``: the seeds where
    ``base`` reached it and the other did not, and the reverse; then the totals, pooled over the
    cells with the same ``total_by(cell)``, with a two-sided sign test over the seeds where the
    two differ."""
    from scipy.stats import binomtest

    cells = list(dict.fromkeys(k[0] for k in hits))
    others = [m for m in dict.fromkeys(k[1] for k in hits) if m != base]
    totals: dict[tuple[str, str], list[int]] = {}  # (group, method) -> won, lost, seeds
    lines = []
    for cell in cells:
        parts = []
        for m in others:
            seeds = [k[2] for k in hits if k[:2] == (cell, m) and (cell, base, k[2]) in hits]
            if not seeds:
                continue
            won = sum(hits[(cell, base, sd)] and not hits[(cell, m, sd)] for sd in seeds)
            lost = sum(hits[(cell, m, sd)] and not hits[(cell, base, sd)] for sd in seeds)
            parts.append(f"vs {m} {won}/{lost}")
            t = totals.setdefault((total_by(cell), m), [0, 0, 0])
            totals[(total_by(cell), m)] = [t[0] + won, t[1] + lost, t[2] + len(seeds)]
        if parts:
            lines.append(" ".join(f"{c:{w}s}" for c, w in zip(cell, (15, 6, 10, 4))) + " " + ", ".join(parts))
    for (group, m), (won, lost, n) in totals.items():
        p = binomtest(won, won + lost).pvalue if won + lost else 1.0
        lines.append(f"all{' ' + group if group else ''}: {base} vs {m}: won {won}, lost {lost} of {n} "
                     f"paired studies (sign test p = {p:.2g})")
    return lines


def shift(values: dict[tuple, float], what: str, base: str = "default",
          group_by: Callable[[tuple], str] = lambda cell: "") -> list[str]:
    """The paired difference (other method - ``base``) of a continuous score per study, e.g. the
    share of the optimum at trial 20: ``values`` maps (cell, method, seed) to it. Pooled over the
    cells with the same ``group_by(cell)`` and over all: the mean with a bootstrap 95% interval,
    the median, and a two-sided Wilcoxon signed-rank p. A whole curve moves where a count at a
    threshold (:func:`side_by_side`) sees only the studies that cross it, so this reads a small
    shift on fewer studies."""
    import numpy as np
    from scipy.stats import bootstrap
    from scipy.stats import wilcoxon

    others = [m for m in dict.fromkeys(k[1] for k in values) if m != base]
    lines = []
    for m in others:
        diffs: dict[str, list[float]] = {}
        for (cell, method, seed), v in values.items():
            if method == m and (cell, base, seed) in values:
                d = v - values[(cell, base, seed)]
                for g in dict.fromkeys([group_by(cell), "all"]):
                    diffs.setdefault(g, []).append(d)
        for g, ds in sorted(diffs.items(), key=lambda kv: kv[0] == "all"):
            d = np.array(ds)
            moved = d[np.abs(d) > 1e-9]
            p = wilcoxon(moved).pvalue if len(moved) >= 2 else 1.0
            lo, hi = (bootstrap((d,), np.mean, confidence_level=0.95, n_resamples=2000, random_state=0,
                                method="percentile").confidence_interval if len(d) >= 2 and np.ptp(d) > 0
                      else (d.mean(), d.mean()))
            lines.append(f"{g:10s} {m} - {base}, {what}: mean {d.mean():+.3f} [{lo:+.3f}, {hi:+.3f}], "
                         f"median {np.median(d):+.3f}, higher in {int(np.sum(d > 1e-9))} / lower in "
                         f"{int(np.sum(d < -1e-9))} of {len(d)} (Wilcoxon p = {p:.2g})")
    return lines
