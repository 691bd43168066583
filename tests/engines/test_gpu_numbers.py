"""Issue 18's wrong numbers, each driven on CPU by a stand-in where the real thing needs a GPU.

ExLlamaV2: TTFT from submission, the draft token budget, TabbyAPI's load forward, the
generator-mode warning, cancelling timed-out jobs, failure classification. llama.cpp:
classification and ``split_mode=tensor``. vLLM: classification, the acceptance window after
the warm-up, the baseline without a known GPU, VRAM need. The hydra_cluster preset's splits.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from autotune.engines.exllamav2.engine import ExLlamaV2Engine
from autotune.engines.exllamav2.engine import tabby_load_forward
from autotune.engines.exllamav2.plan import failure_reason
from autotune.engines.exllamav2.plan import job_args
from autotune.engines.exllamav2.plan import mode_warnings
from autotune.engines.exllamav2.pump import JobPump
from autotune.engines.llamacpp.engine import SPLIT_MODES
from autotune.engines.llamacpp.engine import LlamaCppEngine
from autotune.engines.llamacpp.gpu import decode_failure_reason
from autotune.engines.llamacpp.gpu import load_failure_reason
from autotune.engines.openai_server import OpenAIServerEngine
from autotune.engines.vllm.engine import VLLMEngine
from autotune.engines.vllm.engine import infeasible_reason
from autotune.engines.vllm.gpu import ACCEPTED
from autotune.engines.vllm.gpu import DRAFTED
from autotune.engines.vllm.gpu import vram_need_gb
from autotune.measure.types import Generation

CONF = Path(__file__).resolve().parents[2] / "conf"


# ---- ExLlamaV2: the pump --------------------------------------------------------------------
class SlowIterate:
    """A generator whose ``iterate()`` takes ``step_s`` (the pump holds its lock meanwhile)."""

    def __init__(self, step_s: float, n: int = 3) -> None:
        self.step_s, self.n = step_s, n
        self.jobs: dict[int, int] = {}
        self.cancelled: list[int] = []
        self.in_iterate = threading.Event()

    def enqueue(self, ident: int) -> None:
        self.jobs[ident] = 0

    def cancel(self, ident: int) -> None:
        self.cancelled.append(ident)
        self.jobs.pop(ident, None)

    def num_remaining_jobs(self) -> int:
        return len(self.jobs)

    def iterate(self) -> list[dict]:
        self.in_iterate.set()
        time.sleep(self.step_s)
        out = []
        for ident in list(self.jobs):
            self.jobs[ident] += 1
            k = self.jobs[ident]
            out.append({"identifier": ident, "stage": "streaming", "text": "x", "eos": k >= self.n,
                        "new_tokens": k})
            if k >= self.n:
                del self.jobs[ident]
        return out


def test_ttft_clock_starts_at_submission_not_after_the_pump_lock() -> None:
    gen = SlowIterate(step_s=0.4, n=1000)
    pump = JobPump(gen)
    try:
        pump.submit(lambda i: i)  # keeps the pump iterating
        gen.in_iterate.clear()
        assert gen.in_iterate.wait(5)  # the pump now holds the lock for ~0.4 s
        called = time.perf_counter()
        _, t0, _ = pump.submit(lambda i: i)
        assert time.perf_counter() - called > 0.1  # submit did wait for the lock...
        assert t0 - called < 0.05  # ...but the request's clock started when it was submitted
    finally:
        pump.close()


def test_a_timed_out_request_is_cancelled_in_the_generator() -> None:
    gen = SlowIterate(step_s=0.05, n=1_000_000)
    pump = JobPump(gen)
    try:
        ident, _, q = pump.submit(lambda i: i)
        results = pump.results(ident, q, timeout_s=5)
        next(results)
        results.close()  # the caller gives up (a timeout raises out of the same generator)
        deadline = time.monotonic() + 5
        while gen.num_remaining_jobs() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gen.cancelled == [ident] and gen.num_remaining_jobs() == 0
    finally:
        pump.close()


def test_a_finished_request_is_not_cancelled() -> None:
    gen = SlowIterate(step_s=0.001, n=2)
    pump = JobPump(gen)
    try:
        ident, _, q = pump.submit(lambda i: i)
        assert len(list(pump.results(ident, q, timeout_s=5))) == 2
        assert gen.cancelled == []
    finally:
        pump.close()


# ---- ExLlamaV2: the draft token budget ---------------------------------------------------------
def upstream_new_tokens(max_new_tokens: int, num_draft_tokens: int, accepted_per_step: int) -> int:
    """exllamav2 0.3.2's stop rule (dynamic.py::receive_sample), token by token."""
    new = 0
    while True:
        for _ in range(accepted_per_step):
            new += 1
            if new >= max_new_tokens - num_draft_tokens:
                return new


@pytest.mark.parametrize(("k", "accepted"), [(0, 1), (4, 3), (8, 9), (1, 2)])
def test_draft_trials_generate_as_many_tokens_as_asked(k, accepted) -> None:
    args = job_args(64, True, k, eos_token_id=2)
    assert upstream_new_tokens(args["max_new_tokens"], k, accepted) == 64
    assert args["min_new_tokens"] == 64 and args["stop_conditions"] == []
    assert job_args(64, False, k, 2)["stop_conditions"] == [2]


# ---- ExLlamaV2: TabbyAPI's load forward --------------------------------------------------------
class RecordingModel:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def forward(self, ids, cache=None, preprocess_only=False):
        self.calls.append((tuple(ids.shape), cache, preprocess_only))


class Cache:
    current_seq_len = 0


class StandInTorch:
    """The three torch names the load forward uses (importing torch here would leak into other
    tests that check the registry imports no torch)."""

    long = "int64"

    @staticmethod
    def zeros(shape, dtype):
        return np.zeros(shape, dtype=dtype)

    @staticmethod
    def inference_mode():
        return contextlib.nullcontext()


def test_the_trial_loads_as_tabbyapi_with_a_full_chunk_forward() -> None:
    model, cache = RecordingModel(), Cache()
    tabby_load_forward(model, cache, 2048, StandInTorch)
    assert model.calls == [((1, 2048), cache, True)]
    assert cache.current_seq_len == 0


# ---- ExLlamaV2: the export says when the generator mode may differ ------------------------------
@pytest.mark.parametrize(("paged", "fragment"), [(False, "non-paged, batch size 1"), (None, "generator mode"),
                                                 (True, "falls back")])
def test_export_warns_about_the_generator_mode(paged, fragment) -> None:
    settings = {"gpus": [{"name": "H100", "memory_gb": 80}]}
    params = {"model": "m"} if paged is None else {"model": "m", "paged": paged}
    warnings = ExLlamaV2Engine.export_warnings(params, settings)
    assert any(fragment in w for w in warnings)
    assert mode_warnings({"paged": paged})


# ---- classification ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("exc", "infeasible"),
    [(AssertionError("Can't find /models/typo"), False),
     (ValueError(" ## No .safetensors files found in /models/empty"), False),
     (AssertionError("some internal invariant"), False),
     (AssertionError("max_chunk_size must be multiple of 256, received 300"), True),
     (AssertionError("num_draft_tokens cannot be larger than max_q_size."), True),
     (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True)],
)
def test_exllamav2_wrong_model_path_is_a_failure_not_infeasible(exc, infeasible) -> None:
    assert (failure_reason(exc) is not None) is infeasible


@pytest.mark.parametrize(
    ("exc", "gpu", "infeasible"),
    [(ValueError("Model path does not exist: /models/typo.gguf"), False, False),
     (ValueError("Model path does not exist: /models/typo.gguf"), True, False),
     (ValueError("Failed to create llama_context"), False, True),
     (ValueError("Failed to load model from file: /m.gguf"), True, True),
     (ValueError("Failed to load model from file: /m.gguf"), False, False)],
)
def test_llamacpp_load_failures(exc, gpu, infeasible) -> None:
    assert (load_failure_reason(exc, gpu) is not None) is infeasible


@pytest.mark.parametrize(("code", "infeasible"), [(1, True), (-2, True), (-3, False), (-1, False), (2, False)])
def test_llamacpp_decode_out_of_memory_is_infeasible(code, infeasible) -> None:
    assert (decode_failure_reason(RuntimeError(f"llama_decode returned {code}")) is not None) is infeasible
    assert decode_failure_reason(RuntimeError("something else")) is None


def test_llamacpp_wrong_model_path_is_a_failure(tmp_path: Path) -> None:
    engine = LlamaCppEngine({}, {"m": {"path": str(tmp_path / "typo.gguf")}}, {"model": "m"}, tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        engine.start()


@pytest.mark.parametrize(
    ("tail", "infeasible"),
    [("WARNING x: ValueError raised in a probe, ignored\nOSError: /models/typo does not appear to have a "
      "file named config.json", False),
     ("huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name'", False),
     ("ValueError: The model's max seq len (4096) is larger than the maximum number of tokens", True),
     ("INFO a\nValueError: ValueError hint\nINFO b\nRuntimeError: Engine core initialization failed", False),
     ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", True)],
)
def test_vllm_classifies_by_the_final_error(tail, infeasible) -> None:
    assert (infeasible_reason(tail) is not None) is infeasible


# ---- llama.cpp split_mode --------------------------------------------------------------------------
def test_llamacpp_split_mode_has_tensor() -> None:
    assert SPLIT_MODES["tensor"] == 3  # LLAMA_SPLIT_MODE_TENSOR, -sm tensor
    assert "tensor" in LlamaCppEngine.knobs["split_mode"].choices
    llama_cpp = pytest.importorskip("llama_cpp")
    assert llama_cpp.LLAMA_SPLIT_MODE_TENSOR == SPLIT_MODES["tensor"]


# ---- vLLM ------------------------------------------------------------------------------------------
class FakeServer(OpenAIServerEngine):
    """Stands in for the vLLM server below VLLMEngine in the MRO: each request drafts 10 tokens;
    the first ``cold`` (warm-up) requests accept none, later ones 6."""

    cold = 2

    def start(self) -> None:
        self.counters = {DRAFTED: 0.0, ACCEPTED: 0.0}
        self.served = 0

    def generate(self, prompt: str, max_tokens: int, ignore_eos: bool = True) -> Generation:
        self.served += 1
        self.counters[DRAFTED] += 10
        self.counters[ACCEPTED] += 0 if self.served <= self.cold else 6
        return Generation(4, max_tokens, [0.001 * (i + 1) for i in range(max_tokens)], 0.001 * max_tokens)

    def stop(self) -> None:
        pass


class VLLMOnFakeServer(VLLMEngine, FakeServer):
    def _spec_counters(self) -> dict[str, float]:
        return dict(self.counters)


def test_vllm_accept_rate_excludes_the_warm_up(tmp_path: Path) -> None:
    engine = VLLMOnFakeServer({"device": "cpu"}, {}, {"speculative": "ngram"}, tmp_path)
    engine.start()
    metrics, _ = engine.measure({"warmup": 2, "requests": 4, "concurrency": 1, "max_tokens": 4})
    assert metrics["accept_rate"] == pytest.approx(0.6)


def test_vllm_baseline_without_a_known_gpu_leaves_batch_limits_to_vllm() -> None:
    from autotune.hardware import list_gpus

    if list_gpus():
        pytest.skip("this machine has a GPU: the baseline reads it")
    p = VLLMEngine.default_params({"device": "cuda"}, {"m": {"path": "/m"}})
    assert p["max_num_seqs"] is None and p["max_num_batched_tokens"] is None
    argv = VLLMEngine.engine_args(p, {"device": "cuda"}, "/m")
    assert "--max-num-seqs" not in argv and "--max-num-batched-tokens" not in argv


def test_vllm_vram_need_comes_from_its_kv_pool_log() -> None:
    log = ("INFO gpu_worker.py: Available KV cache memory: 60.00 GiB\n"
           "INFO kv_cache_utils.py: GPU KV cache size: 491,520 tokens\n"
           "INFO kv_cache_utils.py: Maximum concurrency for 4,096 tokens per request: 120.00x\n")
    need, how = vram_need_gb(72.0, log, 1)
    assert need == pytest.approx(72.0 - 60.0 * (1 - 1 / 120)) and "KV pool" in how
    assert vram_need_gb(144.0, log, 2)[0] == pytest.approx(144.0 - 120.0 * (1 - 1 / 120))  # per rank
    assert vram_need_gb(72.0, "no such lines", 1) is None


# ---- the hydra_cluster preset ----------------------------------------------------------------------
def test_hydra_cluster_manual_splits_leave_room_for_the_cache() -> None:
    cfg = yaml.safe_load((CONF / "hydra_cluster.yaml").read_text())
    gpus = cfg["engine"]["settings"]["gpus"]
    manual = [c for c in cfg["space"]["gpu_split"]["choices"] if c not in ("auto", "tp")]
    assert manual
    for split in manual:
        for gb, gpu in zip((float(x) for x in split.split(",")), gpus, strict=True):
            usable = gpu["memory_gb"] * 0.9996  # a "24 GB" 4090 reports 23.99 GiB
            assert usable - gb >= 3.5, f"{split} leaves {usable - gb:.2f} GiB on {gpu['name']}"
