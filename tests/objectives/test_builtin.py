"""The built-in metric registry: every metric the trial worker reports is declared once."""

from __future__ import annotations

import pytest
from autotune.objectives import all_metrics
from autotune.objectives import get_metric
from autotune.objectives import register_metric

from autotune.measure.types import Generation
from autotune.measure.workload import generation_metrics

QUALITY = ("ppl", "ppl_delta", "ppl_delta_pct", "kld_mean", "kld_p99", "same_top_pct")
ENGINE = ("load_s", "peak_rss_mb", "mem_estimate_mb", "vram_peak_gb", "greedy_match",
          "aggregate_tps")


def test_every_reported_metric_is_registered():
    gens = [Generation(10, 4, [0.1, 0.2, 0.3, 0.4], 0.4, drafted=4, accepted=2)]
    names = set(generation_metrics(gens)) | set(QUALITY) | set(ENGINE)
    missing = names - set(all_metrics())
    assert not missing


@pytest.mark.parametrize(
    ("name", "direction", "unit"),
    [("decode_tps", "maximize", "tok/s"), ("ttft_p95_ms", "minimize", "ms"),
     ("ttft_mad_ms", "minimize", "ms"), ("kld_mean", "minimize", "nats"),
     ("same_top_pct", "maximize", "%"), ("greedy_match", "maximize", ""),
     ("mem_estimate_mb", "minimize", "MB"), ("decode_tps_cv", "minimize", "%")],
)
def test_directions_and_units(name, direction, unit):
    m = get_metric(name)
    assert (m.direction, m.unit) == (direction, unit)
    assert m.description


def test_reregistering_differently_fails():
    m = get_metric("decode_tps")
    assert register_metric(m.name, m.unit, m.direction, m.description) == m  # idempotent
    with pytest.raises(ValueError, match="already registered"):
        register_metric("decode_tps", "tok/s", "minimize", "wrong")


@pytest.mark.parametrize(("metric", "value", "base", "want"), [
    ("decode_tps", 60.0, 40.0, 1.5),          # higher is better: value / base
    ("ttft_p95_ms", 100.0, 150.0, 1.5),       # lower is better: base / value
    ("decode_tps", 30.0, 40.0, 0.75),         # a slower winner is a ratio below 1, not hidden
    ("decode_tps", None, 40.0, None),
    ("decode_tps", 60.0, 0.0, None),
    ("ttft_p95_ms", float("inf"), 150.0, None),
    ("ttft_p95_ms", 100.0, float("nan"), None),
])
def test_the_one_speedup_follows_the_metrics_direction(metric, value, base, want):
    got = get_metric(metric).speedup(value, base)
    assert got == pytest.approx(want) if want is not None else got is None
