"""The roofline share: checked against a hand computation from the GGUF file and the read probe."""

from __future__ import annotations

import json
import os

import pytest

from autotune.engines.llamacpp.gguf_memory import estimate_llamacpp_mb
from autotune.engines.llamacpp.gguf_memory import read_gguf_metadata
from autotune.engines.llamacpp.gguf_memory import read_gguf_tensors
from autotune.engines.llamacpp.predict import predict_llamacpp
from autotune.engines.predict import Prediction
from autotune.engines.roofline import DeviceRead
from autotune.engines.roofline import probe_ram_read_gbps
from autotune.engines.roofline import roofline
from autotune.measure.spec import SLOSpec
from autotune.measure.spec import WorkloadSpec
from autotune.record.summary import Headroom
from autotune.record.summary import StudySummary
from autotune.run.headroom import context_tokens
from autotune.run.headroom import why_unknown
from autotune.run.headroom import winner_headroom
from autotune.run.headroom import with_roofline
from autotune.search.trials import Record
from autotune.trial.spec import TrialResult


def test_roofline_share_is_decode_speed_over_bandwidth_per_bytes_read(gemma_path, tmp_path, monkeypatch):
    """By hand: a token reads the whole GGUF (dense model, every layer on the CPU) and the f16
    KV of every layer at the context (prompt + half the output); the limit is the read
    probe's bandwidth over those bytes."""
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))
    probe = probe_ram_read_gbps(size_mb=64, repeats=2)
    (tmp_path / "bandwidth.json").write_text(json.dumps({"ram_read_gbps": probe}))
    params = {"model": "q4_k_m", "n_ctx": 2048, "n_gpu_layers": 0, "type_k": "f16", "type_v": "f16"}
    pred = predict_llamacpp(params, {}, {"q4_k_m": {"path": str(gemma_path)}})
    assert [r.label for r in pred.reads] == ["RAM"] and pred.reads[0].source == "read probe"

    meta = read_gguf_metadata(gemma_path)  # gemma-3 270M: 18 layers, 1 KV head of 256
    layers, kv_heads = meta["gemma3.block_count"], meta["gemma3.attention.head_count_kv"]
    kv_per_ctx = layers * kv_heads * (256 + 256) * 2  # K and V, f16: 2 bytes each
    ctx = 100 + 32 / 2
    by_hand = os.path.getsize(gemma_path) + kv_per_ctx * ctx
    limit = probe * 1e9 / by_hand

    samples = {"prompt_tokens": [100, 100, 100], "output_tokens": [32, 32, 32]}
    result = TrialResult(1, "ok", {"decode_tps": 50.0}, samples=samples)
    out = with_roofline(result, [r.to_dict() for r in pred.reads], WorkloadSpec())
    assert out.metrics["read_mb_per_token"] == pytest.approx(by_hand / 2**20, rel=1e-9)
    assert out.metrics["roofline_tps"] == pytest.approx(limit, rel=1e-9)
    assert out.metrics["roofline_pct"] == pytest.approx(100 * 50.0 / limit, rel=1e-9)


def test_streams_decoded_together_share_the_weights():
    reads = [DeviceRead("RAM", 1e9, 1e5, 10.0, "read probe")]
    one, four = roofline(reads, 1000, 1), roofline(reads, 1000, 4)
    assert one.bytes_per_step == 1e9 + 1e8 and four.bytes_per_step == 1e9 + 4e8
    assert one.limit_tps == pytest.approx(10e9 / 1.1e9)
    assert roofline([DeviceRead("GPU 0", 1e9, 0, None)], 10) is None  # bandwidth unknown
    wl = WorkloadSpec(load="slo", slo=SLOSpec(ttft_p95_ms=100))
    res = TrialResult(1, "ok", {"decode_tps": 2.0, "max_concurrency_at_slo": 4.0},
                      samples={"prompt_tokens": [0], "output_tokens": [2000]})
    out = with_roofline(res, [r.to_dict() for r in reads], wl)
    assert out.metrics["read_mb_per_token"] == pytest.approx((1e9 + 4e8) / 2**20)


def test_context_is_the_median_of_prompt_plus_half_the_output():
    assert context_tokens({"prompt_tokens": [10, 20, 30], "output_tokens": [4, 4, 40]}) == 22.0
    assert context_tokens({}) is None


def test_a_moe_token_reads_only_the_experts_it_uses(tmp_path):
    """A GGUF with 8 experts of which 2 are used: a token reads the shared tensors and a
    quarter of the stacked expert tensors."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "moe.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    for key, value in (("block_count", 1), ("embedding_length", 64), ("attention.head_count", 4),
                       ("attention.head_count_kv", 2), ("context_length", 512)):
        w.add_uint32(f"qwen3moe.{key}", value)
    w.add_uint32("qwen3moe.expert_count", 8)
    w.add_uint32("qwen3moe.expert_used_count", 2)
    w.add_uint32("qwen3moe.vocab_size", 100)
    w.add_tensor("token_embd.weight", np.zeros((100, 64), dtype=np.float32))
    w.add_tensor("blk.0.ffn_up_exps.weight", np.zeros((8, 64, 128), dtype=np.float32))
    w.add_tensor("blk.0.ffn_down_exps.weight", np.zeros((8, 128, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    experts = 2 * 8 * 64 * 128 * 4
    assert sum(b for n, b in read_gguf_tensors(path).items() if "_exps" in n) == experts
    est = estimate_llamacpp_mb(path, 512)
    size = os.path.getsize(path)
    assert est["active_weights_mb"] * 2**20 == pytest.approx(size - experts * 6 / 8)
    assert est["weights_mb"] * 2**20 == size  # memory still holds every expert


def test_the_summary_states_the_share_or_why_it_is_unknown():
    win = Record(3, {}, {"decode_tps": 40.0, "roofline_tps": 80.0, "roofline_pct": 50.0,
                         "read_mb_per_token": 300.0}, "ok", True)
    reads = [DeviceRead("RAM", 3e8, 0, 21.3, "read probe").to_dict()]
    h = winner_headroom("llama_cpp", win, Prediction.from_stored({"reads": reads}),
                        "no energy counter readable here")
    assert h.roofline_words() == ("the winner runs at 50% of this box's memory-bandwidth limit "
                                  "(300 MB read per decode step at RAM 21.3 GB/s (read probe): "
                                  "at most 80 tok/s per stream)")
    assert h.energy_words() == "no energy counter readable here"
    s = StudySummary(study="s", engine="llama_cpp", interrupted=False, headroom=h)
    assert StudySummary.from_dict(json.loads(s.to_json())).headroom == h
    blind = Record(1, {}, {"decode_tps": 40.0}, "ok", True)
    assert "does not say how many bytes" in winner_headroom("command", blind, None).note
    assert "engine.settings.predict" in why_unknown("command", None, {})
    gpu = Prediction(reads=(DeviceRead("GPU 0", 1.0, 0.0, None),))
    assert "no bandwidth for GPU 0" in why_unknown("llama_cpp", gpu, {"decode_tps": 1.0})
    assert Headroom(energy_j_per_token=0.5, energy_note="RAPL").energy_words() == (
        "energy 0.5 J per output token (RAPL)")


def test_the_re_measured_winner_has_the_share_of_its_re_measured_speed():
    from types import SimpleNamespace

    from autotune.run.remeasure import _merge

    rec = Record(3, {}, {"decode_tps": 40.0, "roofline_tps": 80.0, "roofline_pct": 50.0}, "ok", True)
    merged = _merge(rec, [{"decode_tps": 20.0}, {"decode_tps": 24.0}], [{}, {}],
                    SimpleNamespace(constraints=[]))
    assert merged.metrics["decode_tps"] == 22.0
    assert merged.metrics["roofline_pct"] == pytest.approx(100 * 22.0 / 80.0)
