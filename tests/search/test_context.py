"""A context overflow read as a rule (autotune.search.context) and its hook in bo.

The engines' own overflow messages name what the request needed and the context it had; the knob
holding that context is found in the failed trial's values; then ``bo`` on a real Optuna study
told through :func:`autotune.record.optuna_study.tell` (the driver's path): after one launch at a
too-small context, no configuration below what it needed is proposed again, and the larger
contexts stay in play.
"""

from __future__ import annotations

import numpy as np
import pytest

from autotune.config.schema import load_config
from autotune.search import context
from autotune.trial.spec import TrialResult

SERVER = ("the server rejected the request: HTTP 400: {\"error\":{\"code\":400,\"message\":\"request (4612 "
          "tokens) exceeds the available context size (4096 tokens), try increasing it\"}}")


@pytest.mark.parametrize(("reason", "seen"), [
    (SERVER, (4612, 4096)),  # llama-server (the vendored build's own string)
    ("ValueError: Requested tokens (5000) exceed context window of 2048", (5000, 2048)),  # llama-cpp-python
    ("This model's maximum context length is 8192 tokens. However, you requested 9000 tokens "
     "(8000 in the messages, 1000 in the completion).", (9000, 8192)),  # vLLM
    ("n_ctx=64 is too small for a 100-token prompt + 16 new tokens", (116, 64)),  # autotune's llamacpp engine
    ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 812.00 MiB on device 0: cudaMalloc failed: "
     "out of memory", None),
    ("", None),
])
def test_the_engines_overflow_lines_say_what_was_needed_and_what_the_context_held(reason, seen):
    assert context.overflow(reason) == seen


def test_the_context_is_the_knob_holding_the_size_the_line_names():
    assert context.context_knob({"n_ctx": 4096, "threads": 8}, 4096) == "n_ctx"
    assert context.context_knob({"n_ctx": 4096, "ubatch": 4096}, 4096) == "n_ctx"  # a tie: the name settles it
    assert context.context_knob({"a": 4096, "b": 4096}, 4096) is None  # nothing settles it
    assert context.context_knob({"n_ctx": 8192, "parallel": 2}, 4096) is None  # a slot's share: no knob holds it
    assert context.context_knob({"flag": True, "n_ctx": 1}, 1) == "n_ctx"  # a bool is not a number here


def test_failures_become_the_largest_need_per_knob_and_rule_out_what_is_below_it(monkeypatch):
    failures = [({"n_ctx": 4096}, SERVER),
                ({"n_ctx": 2048}, "Requested tokens (4700) exceed context window of 2048"),
                ({"n_ctx": 8192}, "cudaMalloc failed: out of memory"),
                ({"n_ctx": 8192}, "request (100 tokens) exceeds the available context size (8192 tokens)")]
    need = context.limits(failures)
    assert need == {"n_ctx": 4700}  # a need below the context it names teaches nothing
    assert not context.allowed({"n_ctx": 4096, "threads": 4}, need)
    assert context.allowed({"n_ctx": 8192}, need)
    assert context.allowed({"n_ctx": 0}, need)  # 0: the model's own context
    assert context.allowed({"threads": 4}, need)  # the knob inactive here
    assert context.explained({"n_ctx": 4096}, SERVER)
    assert not context.explained({"n_ctx": 8192}, "cudaMalloc failed: out of memory")
    monkeypatch.setattr(context, "CONTEXT", False)
    assert context.limits(failures) == {}


NEED = 4612  # tokens the workload's longest request needs


def _config():
    return load_config({
        "engine": {"kind": "command", "settings": {
            "argv": ["x", "{quant}"],
            "knobs": {"quant": {"type": "str", "choices": ["q4", "q5", "q6", "q8"]},
                      "n_ctx": {"type": "int", "low": 512, "high": 65536},
                      "threads": {"type": "int", "low": 1, "high": 16}},
            "defaults": {"quant": "q4", "n_ctx": 16384, "threads": 8}}},
        "space": {"quant": {"type": "categorical", "choices": ["q4", "q5", "q6", "q8"], "ordered": True},
                  "n_ctx": {"type": "categorical", "choices": [2048, 4096, 8192, 16384, 32768], "ordered": True},
                  "threads": {"type": "categorical", "choices": [4, 8, 12, 16]}},
        "objectives": ["decode_tps"],
        "quality": {"enabled": False},
    })


def _run(p: dict, number: int) -> TrialResult:
    """Speed falls with the context (a larger KV cache to read) and rises with the threads; a
    context below NEED is rejected as llama-server rejects it."""
    if p["n_ctx"] < NEED:
        return TrialResult(number, "infeasible", reason=SERVER.replace("4096 tokens", f"{p['n_ctx']} tokens"))
    tps = 50.0 - 0.0005 * p["n_ctx"] + 2.0 * ["q8", "q6", "q5", "q4"].index(p["quant"]) + 0.2 * p["threads"]
    return TrialResult(number, "ok", {"decode_tps": tps})


@pytest.mark.parametrize("seed", [0, 1])
def test_bo_never_proposes_a_context_below_what_an_overflow_needed(seed, bo_run):
    start = [{"quant": "q4", "n_ctx": 16384, "threads": 8}, {"quant": "q6", "n_ctx": 4096, "threads": 4},
             {"quant": "q8", "n_ctx": 32768, "threads": 16}]
    proposed = [p for p, _ in bo_run(_config(), _run, start, seed)[len(start):]]
    assert all(p["n_ctx"] >= NEED for p in proposed), [p["n_ctx"] for p in proposed]
    assert any(p["n_ctx"] == 8192 for p in proposed)  # the next context up is not judged by the failure


def test_the_vectorised_rule_over_a_pool_agrees_with_the_rule_per_configuration():
    """bo filters every pool row at each ask (PoolSampler._free) on a cached column of the knob's
    values: the same rows as :func:`context.allowed` one configuration at a time, as the pool grows."""
    from autotune.search.pool import Pool

    configs = [{"n_ctx": 4096, "t": 1}, {"n_ctx": 8192, "t": 1}, {"t": 2}, {"n_ctx": 0, "t": 3},
               {"n_ctx": True, "t": 4}, {"n_ctx": "4096", "t": 5}, {"n_ctx": 4700, "t": 6}]
    pool = Pool(configs[:4], [str(i) for i in range(4)], np.zeros((4, 1)), None)
    need = {"n_ctx": 4700}
    assert context.ruled_out(pool.numbers("n_ctx"), 4700).tolist() == [True, False, False, False]
    pool.params += configs[4:]  # grown: the column is extended, not recomputed from a stale copy
    got = context.ruled_out(pool.numbers("n_ctx"), 4700).tolist()
    assert got == [not context.allowed(c, need) for c in configs] == [True, False, False, False, False, False, False]
