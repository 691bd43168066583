"""The GPU-path logic of the exllamav2 engine that runs on CPU: paged/non-paged choice,
chunk clamp, reserve list, failure classification, the pump thread with a fake generator,
TTFT from the first token's arrival, the extension pre-flight and the TabbyAPI rope_alpha.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from autotune.engines.cuda_ext import EXLLAMAV2
from autotune.engines.cuda_ext import EXLLAMAV3
from autotune.engines.cuda_ext import build_extension
from autotune.engines.cuda_ext import stale_locks
from autotune.engines.exllamav2.engine import ExLlamaV2Engine
from autotune.engines.exllamav2.engine import generation_from_results
from autotune.engines.exllamav2.plan import choose_paged
from autotune.engines.exllamav2.plan import clamp_chunk
from autotune.engines.exllamav2.plan import failure_reason
from autotune.engines.exllamav2.plan import load_plan
from autotune.engines.exllamav2.plan import reserve_vram
from autotune.engines.exllamav2.plan import tabby_config
from autotune.engines.exllamav2.pump import JobPump
from autotune.engines.exllamav2.pump import PumpFailed

ONE = {"gpus": [{"name": "H100", "memory_gb": 80}]}


def params(**kw) -> dict:
    return ExLlamaV2Engine.full_params(kw, ONE, {"m": {"path": "/models/m"}, "d": {"path": "/models/d"}})


@pytest.mark.parametrize(
    ("requested", "flash", "cc", "expected"),
    [(None, True, 9, True), (None, False, 9, False), (None, True, 7, False), (False, True, 9, False),
     (True, True, 8, True)],
)
def test_paged_mode_follows_flash_attn(requested, flash, cc, expected) -> None:
    paged, why = choose_paged(requested, flash, cc)
    assert paged is expected and why


@pytest.mark.parametrize(("flash", "cc", "fragment"), [(False, 9, "flash-attn"), (True, 7, "capability 7")])
def test_paged_asked_for_without_flash_attn_is_refused(flash, cc, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        choose_paged(True, flash, cc)


def test_non_paged_plan_is_batch_one_with_a_max_seq_len_cache() -> None:
    plan = load_plan(params(max_seq_len=3000, cache_size=8192, max_batch_size=16), ONE, paged=False)
    assert plan["paged"] is False and plan["generator"]["paged"] is False
    assert plan["generator"]["max_batch_size"] == 1
    assert plan["cache_size"] == 3072  # max_seq_len rounded to a page; cache_size is paged-only
    paged = load_plan(params(max_seq_len=3000, cache_size=8192, max_batch_size=16), ONE)
    assert (paged["cache_size"], paged["generator"]["max_batch_size"]) == (8192, 16)


@pytest.mark.parametrize(("chunk", "seq", "expected"), [(2048, 512, 512), (2048, 600, 768), (100, 4096, 256),
                                                        (1000, 4096, 1024), (2048, 4096, 2048)])
def test_chunk_size_is_clamped_to_max_seq_len(chunk, seq, expected) -> None:
    assert clamp_chunk(chunk, seq) == expected
    plan = load_plan(params(chunk_size=chunk, max_seq_len=seq), ONE)
    assert plan["max_input_len"] == plan["generator"]["max_chunk_size"] == expected
    assert plan["max_attention_size"] == expected**2


@pytest.mark.parametrize(("n", "expected"), [(1, [96 * 2**20]), (3, [96 * 2**20, 0, 0]), (0, [96 * 2**20])])
def test_reserve_vram_has_one_entry_per_visible_device(n, expected) -> None:
    assert reserve_vram(96, n) == expected


class OutOfMemoryError(RuntimeError):
    """Named like torch.cuda.OutOfMemoryError (the classification goes by name)."""


@pytest.mark.parametrize(
    ("exc", "fragment"),
    [(RuntimeError("Insufficient VRAM for model and cache"), "out of GPU memory"),
     (AssertionError("Insufficient space in device allocation"), "out of GPU memory"),
     (OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "out of GPU memory"),
     (AssertionError("max_chunk_size must be multiple of 256"), "refused the configuration"),
     (RuntimeError("CUDA error: an illegal memory access"), None),
     (KeyError("x"), None)],
)
def test_failure_classification(exc, fragment) -> None:
    reason = failure_reason(exc)
    assert (reason is None) if fragment is None else (fragment in reason)


class FakeGenerator:
    """A stand-in for ExLlamaV2DynamicGenerator (enqueue / iterate / num_remaining_jobs).

    Each job streams ``n`` tokens, one per ``iterate()`` after ``prefill_iters`` silent ones;
    ``fail_at`` makes the given iterate() call raise ``error``.
    """

    def __init__(self, n: int = 3, prefill_iters: int = 2, fail_at: int | None = None,
                 error: BaseException | None = None, step_s: float = 0.002) -> None:
        self.n, self.prefill_iters, self.fail_at, self.error, self.step_s = n, prefill_iters, fail_at, error, step_s
        self.jobs: dict[int, int] = {}
        self.calls = 0

    def enqueue(self, ident: int) -> None:
        self.jobs[ident] = -self.prefill_iters

    def cancel(self, ident: int) -> None:
        self.jobs.pop(ident, None)

    def num_remaining_jobs(self) -> int:
        return len(self.jobs)

    def iterate(self) -> list[dict]:
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise self.error
        time.sleep(self.step_s)
        out = []
        for ident in list(self.jobs):
            self.jobs[ident] += 1
            k = self.jobs[ident]
            if k <= 0:
                continue
            r = {"identifier": ident, "stage": "streaming", "text": f"t{k}", "token_ids": [k], "eos": k == self.n}
            if k == self.n:
                r.update(new_tokens=self.n, prompt_tokens=5, cached_tokens=0, accepted_draft_tokens=2,
                         rejected_draft_tokens=1, time_enqueued=0.0, time_prefill=0.0)
                del self.jobs[ident]
            out.append(r)
        return out


def test_pump_routes_results_and_times_the_first_token() -> None:
    pump = JobPump(FakeGenerator(n=4, prefill_iters=3, step_s=0.01))
    try:
        ident, t0, q = pump.submit(lambda i: i)
        results = list(pump.results(ident, q, timeout_s=5))
    finally:
        pump.close()
    gen, cached = generation_from_results(results, t0, 5)
    assert (gen.output_tokens, gen.prompt_tokens, cached) == (4, 5, 0)
    assert gen.text == "t1t2t3t4" and (gen.drafted, gen.accepted) == (3, 2)
    assert len(gen.chunk_times) == 4 and gen.chunk_times == sorted(gen.chunk_times)
    assert gen.chunk_times[0] >= 0.03  # three silent prefill iterations of 10 ms before the first token


def test_pump_serves_concurrent_requests() -> None:
    pump = JobPump(FakeGenerator(n=5))
    out: dict[int, int] = {}

    def one() -> None:
        ident, _, q = pump.submit(lambda i: i)
        out[ident] = len(list(pump.results(ident, q, timeout_s=5)))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pump.close()
    assert out == {0: 5, 1: 5, 2: 5, 3: 5}


def test_pump_error_reaches_every_waiting_request_at_once() -> None:
    pump = JobPump(FakeGenerator(n=1000, fail_at=5, error=RuntimeError("CUDA out of memory")))
    t_start = time.monotonic()
    ident, _, q = pump.submit(lambda i: i)
    with pytest.raises(PumpFailed, match="CUDA out of memory") as e:
        list(pump.results(ident, q, timeout_s=600))
    assert time.monotonic() - t_start < 5  # not request_timeout_s
    assert "out of GPU memory" in failure_reason(e.value.cause)
    with pytest.raises(PumpFailed):  # later requests fail at submit
        pump.submit(lambda i: i)
    pump.close()


def test_pump_times_out_without_results() -> None:
    pump = JobPump(FakeGenerator(n=1, prefill_iters=10_000, step_s=0.001))
    ident, _, q = pump.submit(lambda i: i)
    with pytest.raises(TimeoutError, match="request_timeout_s"):
        list(pump.results(ident, q, timeout_s=0.2))
    pump.close()


def test_cached_tokens_are_reported() -> None:
    results = [(1.0, {"stage": "streaming", "text": "a", "eos": True, "new_tokens": 1, "prompt_tokens": 9,
                      "cached_tokens": 256})]
    gen, cached = generation_from_results(results, 0.5, 9)
    assert cached == 256 and gen.chunk_times == [0.5]


def test_stale_build_lock_is_found_only_when_old_and_idle(tmp_path: Path) -> None:
    lock = tmp_path / "py311_cu130" / "exllamav2_ext" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    other = tmp_path / "py311_cu130" / "exllamav3_ext" / "lock"
    other.parent.mkdir(parents=True)
    other.touch()
    name = EXLLAMAV2.name
    assert stale_locks(tmp_path, name, min_age_s=60, busy=lambda d: False) == []  # fresh: a build may be starting
    old = time.time() - 3600
    os.utime(lock, (old, old))
    os.utime(other, (old, old))
    assert stale_locks(tmp_path, name, min_age_s=60, busy=lambda d: True) == []  # ninja runs there
    assert stale_locks(tmp_path, name, min_age_s=60, busy=lambda d: False) == [lock]
    assert stale_locks(tmp_path, EXLLAMAV3.name, min_age_s=60, busy=lambda d: False) == [other]


@pytest.mark.parametrize("ext", [EXLLAMAV2, EXLLAMAV3], ids=lambda e: e.package)
def test_extension_preflight_says_what_is_missing(ext) -> None:
    try:
        __import__(ext.package)
    except ImportError:
        assert build_extension(ext, 5, say=lambda m: None)[0].startswith(f"{ext.package} is not installed")
    else:
        pytest.skip(f"{ext.package} is installed here: the real build is checked on a GPU machine")


def test_tabby_export_pins_rope_alpha_to_what_was_measured() -> None:
    cfg = tabby_config(params(max_seq_len=32768, draft_model="d"), ONE, {"m": {"path": "/models/m"},
                                                                        "d": {"path": "/models/d"}})
    assert cfg["model"]["rope_alpha"] == 1.0 and cfg["draft_model"]["draft_rope_alpha"] == 1.0
    assert tabby_config(params(), ONE, {"m": {"path": "/models/m"}})["draft_model"]["draft_rope_alpha"] is None
