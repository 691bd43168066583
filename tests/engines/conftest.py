"""Shared fixtures for engine tests: real models (skipped cleanly when absent), process checks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.procs import process_alive
from tests.helpers.procs import processes_with_arg

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


def _assert_server_gone(pid: int, port: int) -> None:
    assert not process_alive(pid), f"server pid {pid} still runs"
    assert processes_with_arg("--port", str(port)) == [], f"a process still serves port {port}"


@pytest.fixture
def assert_server_gone():
    """A checker: the server pid is gone and no process has ``--port PORT`` in its argv."""
    return _assert_server_gone


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama made offline with the vLLM venv's interpreter."""
    if not VLLM_PYTHON.exists():
        pytest.skip(f"{VLLM_PYTHON} is missing; run `bash .ci/install_vllm.sh` first")
    out = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    subprocess.run(
        [str(VLLM_PYTHON), "-m", "autotune.tools.make_tiny_llama", str(out)],
        check=True, cwd=REPO, capture_output=True, timeout=300,
    )
    return out


@pytest.fixture(scope="module")
def binary() -> Path:
    """The llama-server the llama_server engine would run (skipped, saying how, without one)."""
    from autotune.engines.llama_server import build

    found = build.find_binary()
    if found is None:
        pytest.skip("no llama-server: run `python -m autotune.engines.llama_server.build`")
    return found
