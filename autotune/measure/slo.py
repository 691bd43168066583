"""The most load that meets the SLO: a search over concurrency (or request rate) in a trial.

From ``workload.concurrency`` (closed loop) or ``workload.rate`` (open loop) the level is
doubled while the SLO holds, up to ``max_concurrency`` / ``max_rate`` (and the engine's
own ``max_concurrency``); then the gap between the highest level that met the SLO and
the lowest that broke it is bisected (to one user, or to 10% of the rate). The search
stops early when:

- a level breaks the SLO (latency bound or ``slo.error_rate``; OOMs and rejections are
  recorded as ``oom_at_concurrency`` / ``reject_at_concurrency``);
- throughput saturates: two levels in a row add less than ``saturation_gain`` (5%) of
  output tok/s over the best so far, so more load can only add queueing;
- ``search_time_s`` is spent (no new request starts after it; the trial's own timeout
  stays the hard limit).

The trial reports the timings of the highest level meeting the SLO (or of the first
level when none does), ``max_concurrency_at_slo`` (or ``max_rate_at_slo``; 0 when no
level meets the SLO) and ``goodput_rps`` / ``goodput_tps``: the best over the levels
meeting the SLO of the requests/s and output tok/s that met every per-request bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from autotune.measure.levels import level_metrics
from autotune.measure.levels import raw_samples
from autotune.measure.levels import run_level
from autotune.measure.levels import warm_up
from autotune.measure.load import LevelRun
from autotune.measure.load import slo_violations
from autotune.measure.prompts import load_prompts
from autotune.measure.spec import WorkloadSpec
from autotune.measure.types import Generator

RATE_RESOLUTION = 0.1
SATURATION_PATIENCE = 2
LIMIT_METRICS = ("oom_at_concurrency", "reject_at_concurrency")


@dataclass(frozen=True)
class LevelVerdict:
    """One measured level: its metrics and the SLO bounds it broke (none = it meets the SLO)."""

    level: float
    metrics: dict[str, float]
    violations: tuple[str, ...]
    n_requests: int
    wall_s: float

    @property
    def meets(self) -> bool:
        return not self.violations

    def row(self) -> dict:
        keep = ("ttft_p95_ms", "itl_p95_ms", "e2e_p99_ms", "aggregate_tps", "goodput_rps",
                "goodput_tps", "error_rate")
        return {"level": self.level, "meets_slo": self.meets, "violations": list(self.violations),
                "n_requests": self.n_requests, "wall_s": round(self.wall_s, 3),
                **{k: self.metrics[k] for k in keep if k in self.metrics}}


@dataclass(frozen=True)
class SearchResult:
    """Every level tried (in order), the highest one meeting the SLO, and why it stopped."""

    levels: tuple[LevelVerdict, ...]
    best: LevelVerdict | None
    stopped: str


def search_levels(measure: Callable[[float], LevelVerdict], start: float, ceiling: float,
                  integer: bool, deadline: float, gain: float,
                  clock: Callable[[], float] = time.monotonic) -> SearchResult:
    """Ramp (doubling) while the SLO holds, then bisect between the last pass and first fail."""
    tried: list[LevelVerdict] = []
    passed: float | None = None
    failed: float | None = None
    best_tps, flat, level, stopped = 0.0, 0, start, ""
    while True:
        if clock() >= deadline:
            stopped = f"time budget spent before level {level:g}"
            break
        v = measure(level)
        tried.append(v)
        if not v.meets:
            failed = level
            stopped = f"SLO broken at level {level:g}: {'; '.join(v.violations)}"
            break
        passed = level
        tps = v.metrics.get("aggregate_tps", 0.0)
        flat = flat + 1 if gain > 0 and best_tps > 0 and tps < best_tps * (1 + gain) else 0
        best_tps = max(best_tps, tps)
        if flat >= SATURATION_PATIENCE:
            stopped = f"saturated: throughput stopped growing by level {level:g}"
            break
        if level >= ceiling:
            stopped = f"reached the ceiling {ceiling:g}"
            break
        level = min(level * 2, ceiling)
    lo = passed if passed is not None else 0.0
    while failed is not None and clock() < deadline:
        gap = failed - lo
        if (integer and gap <= 1) or (not integer and gap <= RATE_RESOLUTION * failed):
            break
        mid = (lo + failed) // 2 if integer else (lo + failed) / 2
        if mid <= 0:
            break
        v = measure(mid)
        tried.append(v)
        if v.meets:
            lo = passed = mid
        else:
            failed = mid
    best = next((v for v in reversed(tried) if v.meets and v.level == passed), None)
    return SearchResult(tuple(tried), best, stopped)


def run_slo_search(engine: Generator, wl: WorkloadSpec) -> tuple[dict[str, float], dict]:
    """Warm up, search the most load meeting ``wl.slo``; (metrics, raw samples + the search)."""
    prompts = load_prompts(wl.prompts)
    warm_up(engine, wl, prompts)
    deadline = time.monotonic() + wl.search_time_s
    closed = wl.arrival == "closed"
    engine_limit = engine.max_concurrency
    if closed:
        ceiling = float(min(wl.max_concurrency, engine_limit or wl.max_concurrency))
        start = float(min(wl.concurrency, ceiling))
    else:
        ceiling, start = wl.max_rate, float(wl.rate)
    runs: dict[float, LevelRun] = {}

    def measure(level: float) -> LevelVerdict:
        run = run_level(engine, wl, prompts, level, deadline)
        if not runs and run.outcomes and not run.gens and run.errors[0].exc is not None:
            raise run.errors[0].exc  # nothing ever worked: fail the trial with the reason
        runs[level] = run
        m = level_metrics(run, wl)
        return LevelVerdict(level, m, tuple(slo_violations(m, run.error_rate, wl.slo)),
                            len(run.outcomes), run.wall_s)

    result = search_levels(measure, start, ceiling, closed, deadline, wl.saturation_gain)
    shown = result.best or result.levels[0]
    metrics = {k: v for k, v in shown.metrics.items() if k not in LIMIT_METRICS}
    metrics["max_concurrency_at_slo" if closed else "max_rate_at_slo"] = (
        float(result.best.level) if result.best else 0.0)
    passing = [v for v in result.levels if v.meets]
    for key in ("goodput_rps", "goodput_tps"):
        metrics[key] = max((v.metrics.get(key, 0.0) for v in passing), default=0.0)
    for key in LIMIT_METRICS:
        hits = [v.level for v in result.levels if key in v.metrics]
        if hits:
            metrics[key] = float(min(hits))
    metrics = {k: v for k, v in metrics.items() if not (isinstance(v, float) and math.isnan(v))}
    raw = raw_samples(runs[shown.level].gens) | {
        "concurrency": shown.level, "search": [v.row() for v in result.levels],
        "search_stopped": result.stopped,
    }
    return metrics, raw
