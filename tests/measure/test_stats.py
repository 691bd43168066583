"""Statistics on synthetic samples: known medians, percentiles, MAD, CV, CIs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autotune.measure.stats import bootstrap_ci
from autotune.measure.stats import distribution_metrics
from autotune.measure.stats import median_diff_ci
from autotune.measure.stats import summarize
from autotune.measure.stats import within_noise


@pytest.mark.parametrize(
    ("samples", "median", "p95", "mad", "cv_pct"),
    [
        ([1, 2, 3, 4, 5], 3.0, 4.8, 1.0, 100 * math.sqrt(2.5) / 3),
        ([10, 10, 10, 10], 10.0, 10.0, 0.0, 0.0),
        ([5, 1, 4, 2, 3], 3.0, 4.8, 1.0, 100 * math.sqrt(2.5) / 3),  # order does not matter
        (list(range(1, 101)), 50.5, 95.05, 25.0, 100 * np.std(range(1, 101), ddof=1) / 50.5),
        ([100.0, 101.0, 99.0, 100.0, 1000.0], 100.0, 820.2, 1.0, None),  # one outlier
    ],
)
def test_summary_known_values(samples, median, p95, mad, cv_pct):
    s = summarize(samples)
    assert s.n == len(samples)
    assert s.median == pytest.approx(median)
    assert s.p95 == pytest.approx(p95)
    assert s.mad == pytest.approx(mad)
    if cv_pct is not None:
        assert s.cv_pct == pytest.approx(cv_pct)
    assert s.ci_low <= s.median <= s.ci_high


def test_p99_linear_interpolation():
    s = summarize(list(range(1, 101)))
    assert s.p99 == pytest.approx(99.01)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ci_contains_median_and_is_deterministic(seed):
    x = np.random.default_rng(seed).normal(100, 5, size=30)
    a, b = bootstrap_ci(x), bootstrap_ci(x)
    assert a == b
    assert a[0] <= float(np.median(x)) <= a[1]
    assert a[1] - a[0] < 10  # about 2 x 1.25 sigma/sqrt(n) x 1.96 for a median


def test_ci_narrows_with_more_samples():
    rng = np.random.default_rng(0)
    small = bootstrap_ci(rng.normal(0, 1, 10))
    big = bootstrap_ci(rng.normal(0, 1, 1000))
    assert big[1] - big[0] < small[1] - small[0]


@pytest.mark.parametrize("samples", [[], [float("nan")], [None]])
def test_empty_gives_nan(samples):
    s = summarize(samples)
    assert s.n == 0 and math.isnan(s.median) and math.isnan(s.ci_low)


def test_single_sample():
    s = summarize([7.0])
    assert (s.median, s.p95, s.mad, s.cv_pct, s.ci_low, s.ci_high) == (7, 7, 0, 0, 7, 7)


def test_distribution_metric_names():
    d = distribution_metrics("ttft", "ms", [1, 2, 3])
    assert set(d) == {"ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "ttft_mad_ms"}
    assert d["ttft_p50_ms"] == 2


def test_within_noise():
    rng = np.random.default_rng(0)
    a = rng.normal(100, 2, 20)
    assert within_noise(a, a + 0.1)
    assert not within_noise(a, a + 20)


def test_median_diff_ci_sign():
    lo, hi = median_diff_ci([10, 11, 12, 10, 11], [1, 2, 1, 2, 1])
    assert 0 < lo <= 9.5 <= hi


def test_within_noise_is_the_median_difference_ci():
    # the rule the re-measurement verdict uses: the 95% CI of median(a) - median(b) contains 0
    a, b = [10.0, 10.2, 9.9, 10.1, 10.0], [10.6, 10.8, 10.7, 10.9, 10.6]
    lo, hi = median_diff_ci(a, b)
    assert within_noise(a, b) == (lo <= 0 <= hi) and not within_noise(a, b)
    assert within_noise(a, [10.1, 9.9, 10.0])
    assert within_noise([], b) and within_noise(a, [])  # nothing to compare: not established
    assert within_noise([66.97], [32.2]) and within_noise(a, [1.0])  # one sample: no spread to judge by
