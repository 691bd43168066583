"""Timing metrics from synthetic Generation records, and the shipped prompt sets."""

from __future__ import annotations

import pytest

from autotune.engines.base import Engine
from autotune.errors import InfeasibleConfig
from autotune.measure.types import Generation
from autotune.measure.workload import collect
from autotune.measure.workload import decode_tps
from autotune.measure.workload import generation_metrics
from autotune.measure.workload import load_prompts
from autotune.measure.workload import prompt_sets
from autotune.measure.workload import summarize_run
from autotune.measure.workload import validate_concurrency


def gen(prompt_tokens=100, output_tokens=5, times=(0.1, 0.2, 0.3, 0.4, 0.5), e2e=0.5, **kw):
    return Generation(prompt_tokens, output_tokens, list(times), e2e, **kw)


def test_one_token_per_chunk():
    m = generation_metrics([gen()])
    assert m["ttft_p50_ms"] == pytest.approx(100)
    assert m["prefill_tps"] == pytest.approx(1000)
    assert m["decode_tps"] == pytest.approx(4 / 0.4)
    assert m["tpot_p50_ms"] == pytest.approx(100)
    assert m["itl_p50_ms"] == pytest.approx(100)
    assert m["e2e_p50_ms"] == pytest.approx(500)


def test_speculative_chunk_counts_engine_tokens():
    # a chunk at 0.2 s carries 3 tokens: 4 tokens in 2 chunks; decode counts 3 after the first
    g = gen(output_tokens=4, times=(0.1, 0.2), e2e=0.2)
    m = generation_metrics([g])
    assert decode_tps(g) == pytest.approx(3 / 0.1)
    assert m["decode_tps"] == pytest.approx(30)
    assert m["tpot_p50_ms"] == pytest.approx(100 / 3)
    assert m["itl_p50_ms"] == pytest.approx(100)  # ITL is per chunk


def test_medians_over_requests_and_accept_rate():
    gens = [
        gen(times=(0.1, 0.2, 0.3, 0.4, 0.5), drafted=10, accepted=5),
        gen(times=(0.2, 0.3, 0.4, 0.5, 0.6), e2e=0.6, drafted=10, accepted=7),
        gen(times=(0.3, 0.5, 0.7, 0.9, 1.1), e2e=1.1),
    ]
    m = generation_metrics(gens)
    assert m["ttft_p50_ms"] == pytest.approx(200)
    assert m["decode_tps"] == pytest.approx(10)  # median of 10, 10, 5
    assert m["accept_rate"] == pytest.approx(12 / 20)
    assert m["decode_tps_cv"] > 0


@pytest.mark.parametrize(
    ("g", "expected"),
    [
        (gen(output_tokens=1, times=(0.1,), e2e=0.1), None),  # one token: no decode phase
        (gen(output_tokens=3, times=(0.1, 0.1), e2e=0.1), None),  # zero span
        (gen(output_tokens=0, times=(), e2e=0.05), None),
    ],
)
def test_undefined_decode(g, expected):
    assert decode_tps(g) is expected
    m = generation_metrics([g])
    assert m["decode_tps"] != m["decode_tps"]  # NaN when nothing is defined


def test_empty_generation_keeps_e2e():
    m = generation_metrics([gen(output_tokens=0, times=(), e2e=0.05)])
    assert m["e2e_p50_ms"] == pytest.approx(50)


class CountingEngine(Engine):
    """A small real engine: answers instantly with a fixed token count, records prompts."""

    name = "counting"

    def __init__(self, max_concurrency=None):
        super().__init__({}, {}, {}, ".")
        if max_concurrency is not None:
            self.max_concurrency = max_concurrency
        self.seen: list[str] = []

    def generate(self, prompt, max_tokens, ignore_eos=True):
        self.seen.append(prompt)
        times = [0.01 * (i + 1) for i in range(max_tokens)]
        return Generation(7, max_tokens, times, times[-1])


def test_collect_skips_warmup_and_cycles_prompts():
    eng = CountingEngine()
    wl = {"prompts": "short", "max_tokens": 4, "warmup": 2, "repeats": 3}
    run = collect(eng, wl)
    prompts = load_prompts("short")
    assert eng.seen[:2] == prompts[:2]
    assert run.prompts == prompts[2:5] and len(run.gens) == 3
    metrics, raw = summarize_run(run)
    assert raw["output_tokens"] == [4, 4, 4]
    assert metrics["decode_tps"] == pytest.approx(100)
    assert metrics["aggregate_tps"] > 0


def test_concurrency_runs_threads_and_refuses_single_stream():
    run = collect(CountingEngine(), {"prompts": "short", "max_tokens": 3, "warmup": 0,
                                     "repeats": 2, "concurrency": 3})
    assert len(run.gens) == 6 and run.concurrency == 3
    with pytest.raises(InfeasibleConfig, match="at most 1"):
        validate_concurrency(CountingEngine(max_concurrency=1), 2)
    validate_concurrency(CountingEngine(max_concurrency=1), 1)


def test_llamacpp_declares_single_stream():
    from autotune.engines.llamacpp.engine import LlamaCppEngine

    assert LlamaCppEngine.max_concurrency == 1


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [("short", 90, 100), ("medium", 440, 448), ("long", 1900, 1920), ("code", 150, 384)],
)
def test_prompt_sets_hit_token_targets(name, low, high):
    import json
    from importlib import resources

    assert name in prompt_sets()
    path = resources.files("autotune") / "data" / "prompts" / f"{name}.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    assert len(rows) >= 6
    assert len({r["prompt"] for r in rows}) == len(rows)
    assert all(low <= r["tokens"] <= high for r in rows), [r["tokens"] for r in rows]
    assert load_prompts(name) == [r["prompt"] for r in rows]


@pytest.mark.slow
def test_stored_token_counts_match_the_tokenizer(gemma_path):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(gemma_path), vocab_only=True, verbose=False)
    import json
    from importlib import resources

    for name in ("short", "medium", "code"):
        path = resources.files("autotune") / "data" / "prompts" / f"{name}.jsonl"
        for line in path.read_text().splitlines():
            r = json.loads(line)
            assert len(llm.tokenize(r["prompt"].encode(), add_bos=True, special=False)) == r["tokens"]


def test_unknown_prompt_set():
    with pytest.raises(FileNotFoundError, match="unknown prompt set"):
        load_prompts("nope")
