"""ExLlamaV3Engine on CPU: its knobs, the load plan as TabbyAPI main makes it, the predictor
(EXL3 bpw from config.json) and the TabbyAPI main export. The real engine needs a CUDA GPU
(tests/engines/test_contract.py::TestExLlamaV3Contract, ``AUTOTUNE_EXL3_MODEL``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.engines.exllamav3.engine import ExLlamaV3Engine
from autotune.engines.exllamav3.plan import cache_bits
from autotune.engines.exllamav3.plan import failure_reason
from autotune.engines.exllamav3.plan import load_plan
from autotune.engines.exllamav3.predict import cache_bytes
from autotune.engines.exllamav3.predict import exl3_bits
from autotune.engines.tabbyapi import schema_main
from autotune.errors import ConfigError
from autotune.registry import get_engine_class

HYDRA = {"gpus": [{"name": "RTX 5090", "memory_gb": 32}, {"name": "RTX 4090", "memory_gb": 24}]}
ONE = {"gpus": [{"name": "RTX 4090", "memory_gb": 24}]}
VARIANTS = {"l70": {"path": "/models/Llama-3.1-70B-Instruct-exl3-4.0bpw", "bpw": 4.0},
            "d": {"path": "/drafts/Llama-3.2-1B-Instruct-exl3-4.0bpw", "bpw": 4.0}}


def full(settings: dict = HYDRA, **kw) -> dict:
    return ExLlamaV3Engine.full_params({"model": "l70", **kw}, settings, VARIANTS)


def test_registry_resolves_exllamav3_without_importing_it() -> None:
    """In a fresh interpreter: an earlier test in this process may have imported torch."""
    assert get_engine_class("exllamav3") is ExLlamaV3Engine
    code = ("import sys; from autotune.registry import get_engine_class; "
            "get_engine_class('exllamav3'); print('exllamav3' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


def test_knobs_are_spelt_as_tabbyapi_main() -> None:
    sample = yaml.safe_load((Path(__file__).parents[1] / "data" / "tabbyapi_config_sample.main.yml").read_text())
    keys = set(sample["model"]) | set(sample["draft_model"]) | {"draft_model"}
    assert set(ExLlamaV3Engine.knobs) - keys == {"model"}


@pytest.mark.parametrize(("mode", "bits"), [("FP16", None), ("8,8", (8, 8)), ("8, 4", (8, 4)),
                                            ("Q4", (4, 4)), ("Q6", (6, 6)), ("Q8", (8, 8))])
def test_cache_bits(mode: str, bits) -> None:
    assert cache_bits(mode) == bits


@pytest.mark.parametrize("mode", ["9,9", "1,8", "Q5", "FP8", "8"])
def test_bad_cache_modes_are_infeasible(mode: str) -> None:
    with pytest.raises(ValueError, match="k,v bits 2-8"):
        cache_bits(mode)
    assert any("cache_mode" in r for r in ExLlamaV3Engine.check({"cache_mode": mode}, HYDRA))


def test_plan_autosplit_reserve_in_gb_on_gpu0() -> None:
    plan = load_plan(full(autosplit_reserve=512, cache_mode="6,4"), HYDRA)
    assert plan["mode"] == "auto"
    assert plan["load"] == {"tensor_p": False, "tp_backend": "native", "reserve_per_device": [0.5],
                            "use_per_device": None, "max_chunk_size": 2048, "max_batch_size": 128}
    assert plan["cache"] == {"max_num_tokens": 4096, "max_batch_size": 128, "max_history": 0,
                             "k_bits": 6, "v_bits": 4}
    assert plan["generator"]["num_draft_tokens"] is None and plan["draft"] is None


def test_plan_manual_split_drops_the_reserve_and_tp_keeps_tabbys() -> None:
    manual = load_plan(full(gpu_split="30,22"), HYDRA)["load"]
    assert (manual["use_per_device"], manual["reserve_per_device"], manual["tensor_p"]) == ([30.0, 22.0], None, False)
    tp = load_plan(full(tensor_parallel=True, tensor_parallel_backend="nccl", autosplit_reserve=1024), HYDRA)
    assert tp["mode"] == "tp"
    assert (tp["load"]["tensor_p"], tp["load"]["tp_backend"], tp["load"]["reserve_per_device"]) == (True, "nccl", [96 / 1024])
    tp_split = load_plan(full(tensor_parallel=True, gpu_split="30,22"), HYDRA)["load"]
    assert (tp_split["tensor_p"], tp_split["use_per_device"]) == (True, [30.0, 22.0])


def test_plan_one_gpu_ignores_split_and_tp_as_tabbyapi() -> None:
    plan = load_plan(full(ONE, tensor_parallel=True, gpu_split="20"), ONE)
    assert plan["mode"] == "single" and plan["load"]["tensor_p"] is False
    assert plan["load"]["use_per_device"] is None
    assert "TabbyAPI ignores gpu_split and tensor_parallel with a single GPU." in \
        ExLlamaV3Engine.export_warnings({"model": "l70", "gpu_split": "20"}, ONE)


def test_plan_sizes_follow_tabbyapi() -> None:
    plan = load_plan(full(max_seq_len=8192, cache_size=6000, chunk_size=1000), HYDRA)
    assert plan["cache"]["max_num_tokens"] == 6144  # rounded up to 256
    assert plan["max_seq_len"] == 6144  # cut to the cache
    assert plan["load"]["max_chunk_size"] == 1024
    reasons = ExLlamaV3Engine.check({"max_seq_len": 8192, "cache_size": 6144}, HYDRA)
    assert any("cache_size=6144 < max_seq_len=8192" in r for r in reasons)


def test_plan_drafting_model_and_ngram() -> None:
    d = load_plan(full(draft_model="d", draft_num_tokens=6, draft_cache_mode="Q8"), HYDRA)
    assert d["draft"]["variant"] == "d"
    assert (d["draft"]["cache"]["k_bits"], d["draft"]["cache"]["v_bits"]) == (8, 8)
    assert d["generator"]["num_draft_tokens"] == 6 and d["cache"]["max_history"] == 6
    n = load_plan(full(draft_mode="ngram", draft_model="d", draft_num_tokens=3, ngram_match_min=3), HYDRA)
    assert n["draft"] is None and n["generator"]["ngram_match_min"] == 3
    assert n["generator"]["num_draft_tokens"] == 3
    off = load_plan(full(draft_mode="disabled", draft_model="d"), HYDRA)
    assert off["draft"] is None and off["generator"]["num_draft_tokens"] is None


def test_engine_reasons() -> None:
    assert ExLlamaV3Engine.check({"tensor_parallel": True}, ONE) == [
        "tensor_parallel needs at least 2 GPUs (TabbyAPI ignores it on one)"]
    assert any("set tensor_parallel: true" in r for r in ExLlamaV3Engine.check({"gpu_split": "tp"}, HYDRA))
    assert any("GPU 1" in r for r in ExLlamaV3Engine.check({"gpu_split": "20,30"}, HYDRA))
    assert any("draft_mode='mtp'" in r for r in ExLlamaV3Engine.check({"draft_mode": "mtp"}, HYDRA))
    assert ExLlamaV3Engine.check({"cache_mode": "8,8", "gpu_split": "30,22", "draft_mode": "ngram"}, HYDRA) == []


def test_failure_reason_only_oom_is_infeasible() -> None:
    assert failure_reason(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")).startswith("out of GPU memory")
    assert failure_reason(FileNotFoundError("/models/x/config.json")) is None
    assert failure_reason(AssertionError("bad split")) is None
    assert failure_reason(ValueError("Unknown architecture")) is None


def test_validate_settings_needs_a_variant() -> None:
    with pytest.raises(ConfigError):
        ExLlamaV3Engine.validate_settings(HYDRA, {})
    ExLlamaV3Engine.validate_settings({**HYDRA, "cache_mode": "8,8"}, VARIANTS)


def _model_dir(tmp_path: Path, bits: float, head_bits: int = 6) -> Path:
    d = tmp_path / "Llama-3.1-8B-exl3"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "exl3", "version": "0.0.12", "bits": bits, "head_bits": head_bits},
    }))
    return d


def test_predict_reads_bpw_from_config_json(tmp_path: Path) -> None:
    d = _model_dir(tmp_path, 3.0)
    assert exl3_bits({"path": str(d), "bpw": 5.0}) == (3.0, 6.0)  # the directory wins
    assert exl3_bits({"path": "/nowhere/x", "bpw": 5.0}) == (5.0, 6.0)
    one = {"gpus": [{"name": "RTX 4090", "memory_gb": 24}]}
    low = ExLlamaV3Engine.predict({"model": "m"}, one, {"m": {"path": str(d)}})
    high = ExLlamaV3Engine.predict({"model": "m"}, one, {"m": {"path": str(_model_dir(tmp_path, 6.0))}})
    assert low.fits and high.fits and high.need_gb[0] - low.need_gb[0] > 2.0
    assert low.decode_tps_upper > high.decode_tps_upper > 0


def test_predict_cache_bits_and_oom(tmp_path: Path) -> None:
    assert cache_bytes("FP16") == 2.0 and cache_bytes("4,4") < cache_bytes("8,8") < 2.0
    one = {"gpus": [{"name": "RTX 4090", "memory_gb": 24}]}
    v = {"m": {"path": str(_model_dir(tmp_path, 4.0))}}
    small = ExLlamaV3Engine.predict({"model": "m", "max_seq_len": 65536, "cache_mode": "4,4"}, one, v)
    big = ExLlamaV3Engine.predict({"model": "m", "max_seq_len": 65536 * 4}, one, v)
    assert small.fits and big.fits is False
    seventy = ExLlamaV3Engine.predict({"model": "l70"}, ONE, VARIANTS)
    assert seventy.fits is False  # 70B at 4 bpw does not fit one 24 GB card
    assert ExLlamaV3Engine.predict({"model": "l70", "gpu_split": "30,22"}, HYDRA, VARIANTS).fits


def test_export_is_tabbyapi_main_and_validates(tmp_path: Path) -> None:
    files = ExLlamaV3Engine.export(full(cache_mode="8,4", draft_model="d", draft_num_tokens=5), HYDRA, VARIANTS, tmp_path)
    assert [f.name for f in files] == ["tabbyapi.yml", "tabbyapi_warnings.txt"]
    text = files[0].read_text()
    assert text.startswith("# TabbyAPI config.yml (main branch)")
    doc = yaml.safe_load(text)
    assert doc["model"]["backend"] == "exllamav3" and doc["model"]["cache_mode"] == "8,4"
    assert (doc["model"]["model_dir"], doc["model"]["model_name"]) == ("/models", "Llama-3.1-70B-Instruct-exl3-4.0bpw")
    assert doc["draft_model"]["draft_num_tokens"] == 5 and doc["draft_model"]["draft_mode"] == "model"
    assert schema_main.validate(doc) == []
    assert ExLlamaV3Engine.check_export(files) == []


def test_legacy_cache_mode_exports_as_bits(tmp_path: Path) -> None:
    (f, *_) = ExLlamaV3Engine.export(full(cache_mode="Q6"), HYDRA, VARIANTS, tmp_path)
    assert yaml.safe_load(f.read_text())["model"]["cache_mode"] == "6,6"


def test_main_schema_refuses_the_exllamav2_backend() -> None:
    assert any("exllamav3 only" in p for p in schema_main.validate({"model": {"backend": "exllamav2"}}))
    assert any(p.startswith("draft_model.ngram_match_min")
               for p in schema_main.validate({"draft_model": {"draft_mode": "ngram", "ngram_match_min": 0}}))
