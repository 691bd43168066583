"""Summaries of repeated measurements: median, p95, p99, MAD, CV and a bootstrap CI.

All functions are pure and deterministic (the bootstrap uses a fixed seed), so the same
samples always give the same summary. :func:`within_noise` says whether one set of samples'
lead over another is established (bootstrap CI of the difference of the medians).

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


def within_noise(a: Sequence[float], b: Sequence[float]) -> bool:
    """True when the bootstrap 95% CI of ``median(a) - median(b)`` contains 0, or when a side
    has fewer than two samples: one sample's bootstrap has no spread, so it cannot establish a lead."""
    if len(a) < 2 or len(b) < 2:
        return True
    lo, hi = median_diff_ci(a, b)
    return bool(lo <= 0.0 <= hi)
