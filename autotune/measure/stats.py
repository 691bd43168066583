"""Summaries of repeated measurements: median, p95, p99, MAD, CV and a bootstrap CI.

All functions are pure and deterministic (the bootstrap uses a fixed seed), so the same
samples always give the same summary. :func:`compare_runs` ranks configurations that were
re-measured side by side and says whether the winner's lead is within noise.

Definitions (docs/metrics.md): percentiles use linear interpolation between order
statistics (``numpy.percentile``); MAD is the raw median absolute deviation from the
median (not scaled by 1.4826); CV is the sample standard deviation (ddof=1) over the
mean, in %; the CI is the percentile bootstrap of the median (1000 resamples, seed 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Summary:
    """A distribution summarised over the measured repeats (never the warm-up)."""

    n: int
    median: float
    mean: float
    p95: float
    p99: float
    mad: float
    cv_pct: float
    ci_low: float
    ci_high: float

    @property
    def spread(self) -> float:
        """Width of the bootstrap 95% confidence interval of the median."""
        return self.ci_high - self.ci_low


def bootstrap_ci(
    samples: Sequence[float], stat=np.median, n_boot: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of ``stat`` (deterministic)."""
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        return (float("nan"), float("nan"))
    if x.size == 1:
        return (float(x[0]), float(x[0]))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_boot, x.size))
    stats = stat(x[idx], axis=1)
    alpha = (1 - level) / 2
    return float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha))


def summarize(samples: Sequence[float]) -> Summary:
    """Summarise samples; an empty sequence gives NaNs with n=0."""
    x = np.asarray([s for s in samples if s is not None and np.isfinite(s)], dtype=float)
    if x.size == 0:
        nan = float("nan")
        return Summary(0, nan, nan, nan, nan, nan, nan, nan, nan)
    med = float(np.median(x))
    mean = float(np.mean(x))
    sd = float(np.std(x, ddof=1)) if x.size > 1 else 0.0
    lo, hi = bootstrap_ci(x)
    return Summary(
        n=int(x.size),
        median=med,
        mean=mean,
        p95=float(np.percentile(x, 95)),
        p99=float(np.percentile(x, 99)),
        mad=float(np.median(np.abs(x - med))),
        cv_pct=100.0 * sd / mean if mean else float("nan"),
        ci_low=lo,
        ci_high=hi,
    )


def distribution_metrics(base: str, unit: str, samples: Sequence[float]) -> dict[str, float]:
    """``{base}_p50_{unit}``, ``_p95_``, ``_p99_`` and ``_mad_`` for registered distributions."""
    s = summarize(samples)
    return {
        f"{base}_p50_{unit}": s.median,
        f"{base}_p95_{unit}": s.p95,
        f"{base}_p99_{unit}": s.p99,
        f"{base}_mad_{unit}": s.mad,
    }


def within_noise(a: Sequence[float], b: Sequence[float]) -> bool:
    """True if the bootstrap CIs of the two medians overlap (the lead is within noise)."""
    la, ha = bootstrap_ci(a)
    lb, hb = bootstrap_ci(b)
    return not (la > hb or lb > ha)


@dataclass(frozen=True)
class Comparison:
    """One configuration in a side-by-side re-measurement, ranked best first.

    ``delta_pct`` is this configuration's median relative to the best one's (negative when
    worse for a higher-is-better metric); ``diff_ci_low``/``diff_ci_high`` bound
    ``median(best) - median(this)`` (bootstrap, 95%). ``within_noise_of_best`` is True when
    that interval contains 0, i.e. the best's lead over this one is not established.
    """

    name: str
    rank: int
    n: int
    median: float
    ci_low: float
    ci_high: float
    cv_pct: float
    delta_pct: float
    diff_ci_low: float
    diff_ci_high: float
    within_noise_of_best: bool


def median_diff_ci(
    a: Sequence[float], b: Sequence[float], n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Bootstrap CI of ``median(a) - median(b)``, resampling each side independently."""
    x = np.asarray(a, dtype=float)
    y = np.asarray(b, dtype=float)
    if x.size == 0 or y.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    mx = np.median(x[rng.integers(0, x.size, size=(n_boot, x.size))], axis=1)
    my = np.median(y[rng.integers(0, y.size, size=(n_boot, y.size))], axis=1)
    d = mx - my
    alpha = (1 - level) / 2
    return float(np.quantile(d, alpha)), float(np.quantile(d, 1 - alpha))


def compare_runs(
    samples_by_config: dict[str, Sequence[float]], higher_is_better: bool = True
) -> list[Comparison]:
    """Rank configurations measured side by side (ideally interleaved ABAB...).

    Args:
        samples_by_config: per configuration name, the per-repeat samples of one metric
            (e.g. decode tok/s of every request over every re-measurement round).
        higher_is_better: the metric's direction (``Metric.higher_is_better``).

    Returns:
        One :class:`Comparison` per configuration, best median first. The winner's lead
        over the runner-up is within noise when ``result[1].within_noise_of_best``
        (see :func:`lead_within_noise`). Configurations without finite samples rank last.
    """
    clean = {
        k: [float(v) for v in vs if v is not None and np.isfinite(v)]
        for k, vs in samples_by_config.items()
    }
    sums = {k: summarize(v) for k, v in clean.items()}
    sign = 1.0 if higher_is_better else -1.0

    def key(k: str) -> tuple[int, float]:
        m = sums[k].median
        return (0, -sign * m) if np.isfinite(m) else (1, 0.0)

    order = sorted(clean, key=key)
    best = order[0] if order else None
    out = []
    for rank, k in enumerate(order):
        s = sums[k]
        if best is None or not clean[best] or not clean[k]:
            lo = hi = float("nan")
            tied = False
            delta = float("nan")
        else:
            lo, hi = median_diff_ci(clean[best], clean[k]) if k != best else (0.0, 0.0)
            tied = k == best or bool(lo <= 0.0 <= hi)
            bm = sums[best].median
            delta = 100.0 * (s.median - bm) / abs(bm) if bm else float("nan")
        out.append(
            Comparison(k, rank, s.n, s.median, s.ci_low, s.ci_high, s.cv_pct, delta, lo, hi, tied)
        )
    return out


def lead_within_noise(ranked: Sequence[Comparison]) -> bool:
    """True if the winner of :func:`compare_runs` is not clearly ahead of the runner-up."""
    return len(ranked) > 1 and ranked[1].within_noise_of_best
