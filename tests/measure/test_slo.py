"""The load search: the most concurrency (or rate) meeting the SLO, on the real fake engine.

The fake engine serves at most ``max_batch`` requests at once and queues the rest, so its
saturation point is known: with a TTFT bound well under the wait that one user more than
``max_batch`` must add, the highest concurrency meeting the SLO is ``max_batch``.
"""

from __future__ import annotations

import itertools
import time

import pytest

from autotune.engines.exllamav2.engine import generation_from_results
from autotune.engines.exllamav2.pump import JobPump
from autotune.engines.fake import FakeEngine
from autotune.measure.slo import LevelVerdict
from autotune.measure.slo import search_levels
from autotune.measure.spec import SLOSpec
from autotune.measure.spec import WorkloadSpec
from autotune.measure.workload import run_workload

# x=0, y=0.3: TTFT ~4 ms, ~200 tok/s, so a 24-token request takes ~115 ms: a queued request
# waits about that long for a slot, far above the 60 ms TTFT bound; one served at once, far
# below (a busy machine's delays only add, and have 55 ms of room there).
FAST_TTFT = {"x": 0.0, "y": 0.3}
SLO = SLOSpec(ttft_p95_ms=60.0)
TOKENS = 24


def fake(tmp_path, **knobs) -> FakeEngine:
    engine = FakeEngine({}, {}, {**FAST_TTFT, **knobs}, tmp_path)
    engine.start()
    return engine


def slo_workload(**kw) -> WorkloadSpec:
    base = {"max_tokens": TOKENS, "repeats": 3, "warmup": 1, "load": "slo", "slo": SLO,
            "max_concurrency": 16, "search_time_s": 60.0}
    return WorkloadSpec(**{**base, **kw})


# How long a request must last for one user over the slots to break the bound for sure.
# At level c+1 on c slots, 3(c+1) sessions: until the last session is taken, 3(c+1) - (c+1)
# requests must finish, which takes c slots at least 2(c+1)S/c, and all that time one user
# waits. So the mean TTFT, and with it the p95, is at least 2S/(3c), however the users'
# phases drift apart. (When they stay in step one request a round waits a whole S, but on
# a busy box they drift, and 24-token requests let 6 users on 5 slots meet 60 ms in CI.)
# The bound itself is 150 ms here: at c users or fewer a request is served at once (~4 ms), and
# on a 2-core VM 3.5x slower than the earlier ones, under three test workers, thread wake-ups
# put a p95 over 60 ms at 2 users on 3 slots (session 29's CI). c = 3: 2S/9 >= 1.5 x 150 ms
# needs S >= 1.01 s: 210 tokens at ~200 tok/s.
SATURATION_SLO = SLOSpec(ttft_p95_ms=150.0)
SATURATION_TOKENS = 210


@pytest.mark.parametrize("max_batch", [2, 3])
def test_search_finds_the_saturation_point_of_the_fake_engine(tmp_path, max_batch):
    wl = slo_workload(max_tokens=SATURATION_TOKENS, slo=SATURATION_SLO)
    metrics, raw = run_workload(fake(tmp_path, max_batch=max_batch), wl)
    found = metrics["max_concurrency_at_slo"]
    assert found == max_batch, raw["search"]
    levels = [row["level"] for row in raw["search"]]
    assert levels[:2] == [1.0, 2.0] and any(not r["meets_slo"] for r in raw["search"])
    assert metrics["goodput_rps"] > 0 and metrics["goodput_tps"] > metrics["goodput_rps"]
    assert metrics["ttft_p95_ms"] <= SATURATION_SLO.ttft_p95_ms  # those of the reported level
    assert raw["concurrency"] == found and "SLO broken" in raw["search_stopped"]


def test_rejections_end_the_search_and_are_recorded_as_a_limit(tmp_path):
    wl = slo_workload(slo=SLOSpec(ttft_p95_ms=10_000.0, error_rate=0.0))
    metrics, raw = run_workload(fake(tmp_path, reject_over=2), wl)
    assert metrics["max_concurrency_at_slo"] == 2
    assert metrics["reject_at_concurrency"] == 3  # the lowest level at which requests bounced
    assert "oom_at_concurrency" not in metrics
    assert any("error_rate" in v for r in raw["search"] for v in r["violations"])


def test_out_of_memory_is_recorded_as_a_limit(tmp_path):
    wl = slo_workload(slo=SLOSpec(ttft_p95_ms=10_000.0, error_rate=0.0), max_concurrency=4)
    metrics, _ = run_workload(fake(tmp_path, oom_over=1), wl)
    assert metrics["max_concurrency_at_slo"] == 1
    assert metrics["oom_at_concurrency"] == 2


def test_no_level_meets_the_slo(tmp_path):
    wl = slo_workload(slo=SLOSpec(ttft_p95_ms=0.001))
    metrics, raw = run_workload(fake(tmp_path), wl)
    assert metrics["max_concurrency_at_slo"] == 0
    assert metrics["goodput_rps"] == 0 and metrics["goodput_tps"] == 0
    assert [r["level"] for r in raw["search"]] == [1.0]


def test_fixed_load_reports_fairness_errors_and_goodput(tmp_path):
    wl = WorkloadSpec(max_tokens=16, repeats=3, warmup=0, concurrency=3, slo=SLO)
    metrics, raw = run_workload(fake(tmp_path), wl)
    assert metrics["error_rate"] == 0.0
    assert 0.9 < metrics["fairness_jain"] <= 1.0  # three equal users on an unloaded engine
    assert metrics["ttft_user_spread_ms"] >= 0
    assert metrics["goodput_rps"] == pytest.approx(metrics["throughput_rps"])
    assert len(raw["ttft_ms"]) == 9


def verdicts(capacity: float, tps_cap: float = 1e9):
    """A synthetic engine: meets the SLO up to ``capacity``; throughput grows until tps_cap."""
    calls = []

    def measure(level):
        calls.append(level)
        tps = min(level, tps_cap) * 10.0
        bad = () if level <= capacity else (f"ttft at {level}",)
        return LevelVerdict(level, {"aggregate_tps": tps}, bad, 1, 1.0)

    return measure, calls


@pytest.mark.parametrize("capacity", [1, 2, 3, 5, 6, 7, 11, 13, 16])
def test_ramp_and_bisect_find_the_exact_integer_level(capacity):
    measure, calls = verdicts(capacity)
    result = search_levels(measure, 1, 16, True, float("inf"), 0.05)
    assert result.best.level == capacity
    assert len(calls) <= 2 * 5  # doubling to 16 plus bisection: logarithmic


def test_rate_search_bisects_to_ten_percent():
    measure, _ = verdicts(7.3)
    result = search_levels(measure, 1.0, 64.0, False, float("inf"), 0.05)
    assert 7.3 * 0.9 <= result.best.level <= 7.3


def test_saturation_stops_the_ramp():
    measure, calls = verdicts(capacity=100, tps_cap=4)
    result = search_levels(measure, 1, 64, True, float("inf"), 0.05)
    assert calls == [1, 2, 4, 8, 16]  # 8 and 16 add no throughput over 4: stop
    assert result.best.level == 16 and "saturated" in result.stopped


def test_time_budget_bounds_the_search():
    clock = itertools.count()  # one tick per call: the budget allows three levels
    measure, calls = verdicts(capacity=100)
    result = search_levels(measure, 1, 64, True, 3, 0.0, clock=lambda: next(clock))
    assert calls == [1, 2, 4]
    assert "time budget" in result.stopped


class BatchingGenerator:
    """ExLlamaV2DynamicGenerator's scheduling without a GPU: ``enqueue`` / ``iterate`` /
    ``num_remaining_jobs``; at most ``max_batch_size`` jobs are active, the rest wait (their
    prefill starts only when a slot frees). Each iterate() is one forward pass of ``step_s``
    that advances every active job by one token."""

    def __init__(self, max_batch_size: int, n_tokens: int = 8, step_s: float = 0.004) -> None:
        self.max_batch_size, self.n, self.step_s = max_batch_size, n_tokens, step_s
        self.pending: list[int] = []
        self.active: dict[int, int] = {}

    def enqueue(self, ident: int) -> None:
        self.pending.append(ident)

    def num_remaining_jobs(self) -> int:
        return len(self.pending) + len(self.active)

    def iterate(self) -> list[dict]:
        while self.pending and len(self.active) < self.max_batch_size:
            self.active[self.pending.pop(0)] = 0
        time.sleep(self.step_s)
        out = []
        for ident in list(self.active):
            self.active[ident] += 1
            k = self.active[ident]
            r = {"identifier": ident, "stage": "streaming", "text": f" t{k}", "eos": k == self.n}
            if k == self.n:
                r.update(new_tokens=self.n, prompt_tokens=5)
                del self.active[ident]
            out.append(r)
        return out


class DynamicGeneratorEngine:
    """The ExLlamaV2 adapter's request path (JobPump + generation_from_results) on the
    batching generator above: what the load search sees of ExLlamaV2 with max_batch_size."""

    name = "exllamav2-logic"
    max_concurrency = None

    def __init__(self, max_batch_size: int, step_s: float, n_tokens: int) -> None:
        self.pump = JobPump(BatchingGenerator(max_batch_size, n_tokens, step_s))

    def generate(self, prompt, max_tokens, ignore_eos=True):
        ident, t0, q = self.pump.submit(lambda i: i)
        gen, _ = generation_from_results(list(self.pump.results(ident, q, 10.0)), t0, 5)
        return gen

    def logprobs(self, text, n_tokens):
        raise NotImplementedError("no logits on the scheduling model")

    def context_tokens(self):
        return None

    def memory(self):
        return {}


@pytest.mark.parametrize("max_batch_size", [2, 4])
def test_search_on_the_exllamav2_request_path_finds_max_batch_size(max_batch_size):
    engine = DynamicGeneratorEngine(max_batch_size, step_s=0.03, n_tokens=16)
    try:
        # one job = 16 passes of 30 ms (480 ms). Up to max_batch_size clients, a first token
        # comes after one or two passes (30-110 ms measured, idle and beside five busy loops);
        # one client more waits for a slot, 320-500 ms as the jobs' phases stagger; two more,
        # 520-750 ms. Scheduling delays push TTFTs up, never down, so the 380 ms bound leaves a
        # loaded box 270 ms of room on the side that matters, and one level over counts as found.
        # (A 200 ms bound found 1 instead of 4 in a clean-clone CI run with three test workers.)
        wl = slo_workload(max_tokens=16, slo=SLOSpec(ttft_p95_ms=380.0), max_concurrency=8)
        metrics, raw = run_workload(engine, wl)
    finally:
        engine.pump.close()
    assert abs(metrics["max_concurrency_at_slo"] - max_batch_size) <= 1, raw["search"]
    assert metrics["goodput_tps"] > 0
