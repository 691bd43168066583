"""Winner selection (``select.rule``: max, knee, weighted) and the Pareto front, table-first."""

from __future__ import annotations

import math

import pytest

from autotune.search.select import pareto_front
from autotune.search.select import rank
from autotune.search.select import search_direction
from autotune.search.select import search_scalar
from autotune.search.trials import Record


def rec(number: int, tps: float, ttft: float, **extra: float) -> Record:
    return Record(number, {"n": number}, {"decode_tps": tps, "ttft_p95_ms": ttft, **extra})


# Three Pareto-optimal trials: fast but slow to start, balanced, quick to start but slow.
FAST = rec(1, 100.0, 300.0)
KNEE = rec(2, 90.0, 120.0)
SNAPPY = rec(3, 40.0, 100.0)
FRONT = [FAST, KNEE, SNAPPY]
OBJ = ["decode_tps", "ttft_p95_ms"]

RANKS = [
    # (rule, metric, weights, records, expected order of numbers)
    ("max", "decode_tps", {}, FRONT, [1, 2, 3]),
    ("max", "ttft_p95_ms", {}, FRONT, [3, 2, 1]),  # a minimised metric: lowest first
    ("knee", "decode_tps", {}, FRONT, [2, 1, 3]),
    ("weighted", "decode_tps", {"decode_tps": 1.0}, FRONT, [1, 2, 3]),
    ("weighted", "decode_tps", {"ttft_p95_ms": 1.0}, FRONT, [3, 2, 1]),
    ("weighted", "decode_tps", {"decode_tps": 1.0, "ttft_p95_ms": 1.0}, FRONT, [2, 1, 3]),
    ("weighted", "decode_tps", {"decode_tps": 3.0, "ttft_p95_ms": 1.0}, FRONT, [2, 1, 3]),
    ("weighted", "decode_tps", {"decode_tps": 1.0, "ttft_p95_ms": 3.0}, FRONT, [2, 3, 1]),
    # ties break on the trial number (the earlier trial wins)
    ("max", "decode_tps", {}, [rec(5, 50.0, 1.0), rec(4, 50.0, 2.0)], [4, 5]),
    ("knee", "decode_tps", {}, [rec(7, 50.0, 1.0), rec(6, 50.0, 1.0)], [6, 7]),
    # a missing metric ranks last under max
    ("max", "decode_tps", {}, [Record(8, {}, {"ttft_p95_ms": 1.0}), rec(9, 1.0, 1.0)], [9, 8]),
    # a NaN metric ranks last under knee and weighted
    ("knee", "decode_tps", {}, [rec(10, math.nan, 100.0), rec(11, 50.0, 120.0)], [11, 10]),
    (
        "weighted",
        "decode_tps",
        {"decode_tps": 1.0},
        [rec(12, math.nan, 1.0), rec(13, 5.0, 1.0)],
        [13, 12],
    ),
    ("max", "decode_tps", {}, [], []),
    ("knee", "decode_tps", {}, [KNEE], [2]),
]


@pytest.mark.parametrize(("rule", "metric", "weights", "records", "expected"), RANKS)
def test_rank(rule, metric, weights, records, expected):
    assert [r.number for r in rank(records, rule, metric, OBJ, weights)] == expected


def test_rank_unknown_rule():
    with pytest.raises(ValueError, match="unknown selection rule"):
        rank(FRONT, "best", "decode_tps", OBJ, {})


FRONTS = [
    # (records, expected Pareto numbers)
    (FRONT, [1, 2, 3]),
    (FRONT + [rec(4, 80.0, 130.0)], [1, 2, 3]),  # dominated by KNEE
    (FRONT + [rec(5, 100.0, 300.0)], [1, 2, 3, 5]),  # equal to FAST: neither dominates
    ([rec(6, 10.0, 10.0), rec(7, 20.0, 5.0)], [7]),
    ([Record(8, {}, {"decode_tps": 500.0, "ttft_p95_ms": 1.0}, feasible=False), KNEE], [2]),
    ([Record(9, {}, {"decode_tps": 500.0}), KNEE], [2]),  # an objective missing
    ([rec(10, math.inf, 1.0), KNEE], [2]),  # not finite
]


@pytest.mark.parametrize(("records", "expected"), FRONTS)
def test_pareto_front(records, expected):
    assert [r.number for r in pareto_front(records, OBJ)] == expected


@pytest.mark.parametrize(("rule", "metric", "weights", "metrics", "expected"), [
    ("max", "decode_tps", {}, {"decode_tps": 80.0, "ttft_p95_ms": 100.0}, 80.0),
    ("max", "ttft_p95_ms", {}, {"decode_tps": 80.0, "ttft_p95_ms": 100.0}, 100.0),
    ("max", "decode_tps", {}, {"ttft_p95_ms": 100.0}, None),
    ("knee", "decode_tps", {}, {"decode_tps": math.e - 1, "ttft_p95_ms": math.e ** 2 - 1}, -0.5),
    ("weighted", "decode_tps", {"decode_tps": 3.0, "ttft_p95_ms": 1.0},
     {"decode_tps": math.e - 1, "ttft_p95_ms": math.e - 1}, 0.5),
    ("weighted", "decode_tps", {"ppl_delta_pct": 1.0}, {"ppl_delta_pct": -(math.e - 1)}, 1.0),
])
def test_search_scalar(rule, metric, weights, metrics, expected):
    got = search_scalar(metrics, rule, metric, ["decode_tps", "ttft_p95_ms"], weights)
    assert got == (pytest.approx(expected) if expected is not None else None)
    assert search_direction(rule, metric) == ("minimize" if metric == "ttft_p95_ms" and rule == "max" else "maximize")
