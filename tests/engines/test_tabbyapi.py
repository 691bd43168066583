"""The ``tabbyapi`` engine against the FAKE TabbyAPI (tests/helpers/fake_tabbyapi.py).

TabbyAPI needs a CUDA GPU, so these tests start the fake, a real process that reads the
trial's ``config.yml`` from its working directory, validates it against the copy of its
branch's config model and serves ``/health`` and streaming ``/v1/completions`` on 127.0.0.1.
Checked: the trial's config.yml is the export's document (only ``network`` differs), the
branch follows the backend, start/stop leave nothing running, and a wrong model directory
fails while an OOM at load is infeasible.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from autotune.engines.tabbyapi.check import branch_of
from autotune.engines.tabbyapi.check import validate
from autotune.engines.tabbyapi.engine import TabbyAPIEngine
from autotune.engines.tabbyapi.engine import tabby_document
from autotune.errors import ConfigError
from autotune.errors import InfeasibleConfig
from autotune.errors import ServerExited
from autotune.measure.spec import QualitySpec
from autotune.measure.spec import WorkloadSpec
from autotune.trial.runner import run_trial
from autotune.trial.spec import TrialSpec

FAKE = Path(__file__).resolve().parents[1] / "helpers"
HYDRA = {"gpus": [{"name": "RTX 5090", "memory_gb": 32}, {"name": "RTX 4090", "memory_gb": 24}]}


def settings(backend: str = "exllamav3", **kw) -> dict:
    return {"tabby_dir": str(FAKE), "entry": "fake_tabbyapi.py", "backend": backend,
            "startup_timeout_s": 30, "default_variant": "m", **kw}


@pytest.fixture
def models(tmp_path: Path) -> dict:
    """A fake model directory (its config.json caps the context at 8192 tokens: beyond, OOM)."""
    d = tmp_path / "models" / "Llama-3.2-1B-exl3"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({
        "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 128256, "quantization_config": {"quant_method": "exl3", "bits": 4.0, "head_bits": 6},
        "fake_max_tokens": 8192, "fake_token_ms": 1}))
    return {"m": {"path": str(d), "bpw": 4.0}, "gone": {"path": str(tmp_path / "models" / "gone")}}


def test_settings_are_checked() -> None:
    TabbyAPIEngine.validate_settings(settings(), {"m": {"path": "/m"}})
    with pytest.raises(ConfigError, match="tabby_dir"):
        TabbyAPIEngine.validate_settings({"backend": "exllamav3"}, {"m": {"path": "/m"}})
    with pytest.raises(ConfigError, match="main.py"):
        TabbyAPIEngine.validate_settings({**settings(), "entry": "main.py"}, {"m": {"path": "/m"}})
    with pytest.raises(ConfigError, match="unknown TabbyAPI backend; available: exllamav2, exllamav3"):
        TabbyAPIEngine.validate_settings(settings("exl2"), {"m": {"path": "/m"}})


def test_knobs_follow_the_backend_less_what_tabbyapi_cannot_set() -> None:
    v3 = TabbyAPIEngine.knobs_for(settings())
    assert {"cache_mode", "tensor_parallel", "draft_mode", "draft_num_tokens"} <= set(v3)
    v2 = TabbyAPIEngine.knobs_for(settings("exllamav2"))
    assert "gpu_split" in v2 and not {"layer_skip_threshold", "paged", "num_draft_tokens"} & set(v2)
    assert TabbyAPIEngine.check({"layer_skip_threshold": 0.9}, settings("exllamav2"))
    assert TabbyAPIEngine.check({"cache_mode": "Q6"}, settings("exllamav2")) == []


@pytest.mark.parametrize(("backend", "branch", "params"), [
    ("exllamav3", "main", {"cache_mode": "8,4", "tensor_parallel": True, "draft_mode": "ngram"}),
    ("exllamav2", "exl2-checkpoint", {"cache_mode": "Q6", "gpu_split": "30,22"}),
])
def test_trial_config_is_the_export_but_for_the_network(tmp_path: Path, models: dict, backend: str,
                                                        branch: str, params: dict) -> None:
    s = {**settings(backend), **HYDRA, "export_port": 5005}
    (exported, *_) = TabbyAPIEngine.export(params, s, models, tmp_path)
    text = exported.read_text()
    assert text.startswith(f"# TabbyAPI config.yml ({branch} branch)")
    export_doc = yaml.safe_load(text)
    trial_doc = yaml.safe_load(TabbyAPIEngine.config_text(
        TabbyAPIEngine.full_params(params, s, models), s, models, 41234, ""))
    assert {k: v for k, v in trial_doc.items() if k != "network"} == \
        {k: v for k, v in export_doc.items() if k != "network"}
    assert export_doc["network"] == {"host": "127.0.0.1", "port": 5005}
    assert trial_doc["network"] == {"host": "127.0.0.1", "port": 41234, "disable_auth": True}
    assert branch_of(export_doc) == branch and validate(export_doc) == []
    assert TabbyAPIEngine.check_export([exported]) == []


def test_the_exl2_export_is_the_exllamav2_engines(tmp_path: Path, models: dict) -> None:
    """One writer: the tabbyapi engine's exl2 document is the exllamav2 engine's tabbyapi.yml."""
    from autotune.engines.exllamav2.engine import ExLlamaV2Engine

    params = {"model": "m", "cache_mode": "Q4", "gpu_split": "tp", "max_seq_len": 8192}
    ours, _ = tabby_document(params, {**settings("exllamav2"), **HYDRA}, models)
    (theirs, *_) = ExLlamaV2Engine.export(params, HYDRA, models, tmp_path)
    assert ours == yaml.safe_load(theirs.read_text())


def spec(tmp_path: Path, models: dict, params: dict, number: int = 0, **kw) -> TrialSpec:
    return TrialSpec(
        number=number, engine="tabbyapi", settings=settings(**kw), variants=models, params=params,
        workload=WorkloadSpec(name="t", prompts="short", max_tokens=8, warmup=0, repeats=2, concurrency=2),
        quality=QualitySpec(enabled=False), timeout_s=60, workdir=str(tmp_path / f"trial{number}"))


def test_a_trial_runs_tabbyapi_with_its_config_and_stops_it(tmp_path: Path, models: dict,
                                                            assert_server_gone) -> None:
    result = run_trial(spec(tmp_path, models, {"max_seq_len": 4096, "cache_mode": "6,6"}))
    assert result.status == "ok", result.reason + result.log_tail
    assert result.metrics["decode_tps"] > 0 and result.metrics["ttft_p50_ms"] > 0
    assert result.info["tabby_branch"] == "main"
    written = yaml.safe_load(Path(result.info["server_config"]).read_text())
    assert written["model"]["cache_mode"] == "6,6" and written["network"]["port"] == result.info["server_port"]
    assert result.info["server_argv"][-1].endswith("fake_tabbyapi.py")
    assert_server_gone(result.info["server_pid"], result.info["server_port"])


def test_the_exl2_checkpoint_form_runs_too(tmp_path: Path, models: dict) -> None:
    result = run_trial(spec(tmp_path, models, {"cache_mode": "Q8"}, backend="exllamav2"))
    assert result.status == "ok", result.reason + result.log_tail
    assert result.info["tabby_branch"] == "exl2-checkpoint"
    assert "backend: exllamav2" in Path(result.info["server_config"]).read_text()


def test_a_wrong_model_directory_fails_with_the_log(tmp_path: Path, models: dict) -> None:
    result = run_trial(spec(tmp_path, models, {"model": "gone"}))
    assert result.status == "failed"
    assert "FileNotFoundError: Model path" in result.reason and "gone" in result.reason


def test_out_of_memory_at_load_is_infeasible(tmp_path: Path, models: dict) -> None:
    result = run_trial(spec(tmp_path, models, {"max_seq_len": 16384}))
    assert result.status == "infeasible"
    assert "out of GPU memory while TabbyAPI loaded the model: torch.OutOfMemoryError" in result.reason


def test_lifecycle_in_process_classifies_and_cleans_up(tmp_path: Path, models: dict,
                                                        assert_server_gone) -> None:
    engine = TabbyAPIEngine(settings(), models, {"max_seq_len": 16384}, tmp_path / "oom")
    try:
        with pytest.raises(InfeasibleConfig):
            engine.start()
    finally:
        engine.stop()
    engine = TabbyAPIEngine(settings(), models, {"model": "gone"}, tmp_path / "gone")
    try:
        with pytest.raises(ServerExited, match="FileNotFoundError"):
            engine.start()
    finally:
        engine.stop()
    engine = TabbyAPIEngine(settings(), models, {"max_seq_len": 2048}, tmp_path / "ok")
    try:
        engine.start()
        gen = engine.generate("Hello there", 5)
        assert gen.output_tokens == 5
        pid, port = engine.proc.pid, engine.port
    finally:
        engine.stop()
    assert_server_gone(pid, port)
