"""What a launch that ran out of context teaches: a context knob's values too small for the workload.

A request longer than the context fails the same way whatever the other knobs hold, and the
engines say by how much: llama-server answers HTTP 400 ``request (N tokens) exceeds the available
context size (M tokens), try increasing it``, llama-cpp-python raises ``Requested tokens (N)
exceed context window of M``, vLLM ``maximum context length is M tokens. However, you requested
N tokens``, autotune's in-process llama.cpp engine ``n_ctx=M is too small for a P-token prompt + G
new tokens`` (N = P + G). The load-time check (:func:`autotune.config.checks.context_rule`) excludes what the
workload's prompts rule out by a lower bound on their tokens (bytes / 8); a real tokenizer, a
chat template or a longer generation can still overflow a context above it.

bo reads such a failure as a rule (:func:`limits`): the knob whose value in the failed trial is
M is the context, and every configuration holding it below N is never proposed again
(:func:`allowed`); the failure leaves bo's model of "does it run" (:func:`explained`), whose
kernel would otherwise spread it over the neighbouring configurations that hold a larger
context (bench moe_30b: a 4,096 context failing, and the same quant at 8,192 judged unlikely to
run). A message that names no M, or an M that no knob of the trial holds (llama-server's slot
context is ``n_ctx / parallel``), teaches nothing here and stays with that model.
``CONTEXT = False`` turns it off (bench/efficiency.py --variant noctx). The startup design is drawn
before any trial ran; the driver moves a queued design point the rule rules out (MOVE_DESIGN).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

CONTEXT = True
# The driver moves a queued startup-design point whose context a finished trial outgrew to the
# smallest value that holds the need (Driver._short_context); False: launch it to fail (bench
# variant nomove).
MOVE_DESIGN = True
_NEED_FIRST = (
    re.compile(r"request \((\d+) tokens\) exceeds the available context size \((\d+) tokens\)", re.I),
    re.compile(r"requested tokens \((\d+)\) exceed context window of (\d+)", re.I),
)
_CTX_FIRST = (
    re.compile(r"maximum context length is (\d+) tokens\. however, (?:you requested|your request has) (\d+)",
               re.I),
)
_OWN = re.compile(r"=(\d+) is too small for a (\d+)-token prompt \+ (\d+) new tokens")
_NAMES = ("ctx", "seq_len", "model_len", "context")  # a tie between knobs holding M goes to one so named


def overflow(reason: str | None) -> tuple[int, int] | None:
    """(tokens needed, context size) an engine's context-overflow message names, else None."""
    text = reason or ""
    for pattern in _NEED_FIRST:
        if m := pattern.search(text):
            return int(m.group(1)), int(m.group(2))
    for pattern in _CTX_FIRST:
        if m := pattern.search(text):
            return int(m.group(2)), int(m.group(1))
    if m := _OWN.search(text):
        return int(m.group(2)) + int(m.group(3)), int(m.group(1))
    return None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def context_knob(params: dict[str, Any], size: int) -> str | None:
    """The knob of ``params`` holding the context ``size`` a failure names (None: none, or a tie
    that no knob's name settles)."""
    holders = [k for k, v in params.items() if _is_number(v) and v == size]
    if len(holders) > 1:
        holders = [k for k in holders if any(n in k.lower() for n in _NAMES)]
    return holders[0] if len(holders) == 1 else None


def limits(failures: list[tuple[dict[str, Any], str | None]]) -> dict[str, int]:
    """Per context knob, the tokens the workload was seen to need, from failed trials'
    (params, reason)."""
    out: dict[str, int] = {}
    if not CONTEXT:
        return out
    for params, reason in failures:
        seen = overflow(reason)
        knob = context_knob(params, seen[1]) if seen and seen[0] > seen[1] else None
        if knob is not None:
            out[knob] = max(out.get(knob, 0), seen[0])
    return out


def explained(params: dict[str, Any], reason: str | None) -> bool:
    """Whether a failure is a context overflow :func:`limits` turns into a rule."""
    return bool(limits([(params, reason)]))


def allowed(params: dict[str, Any], need: dict[str, int]) -> bool:
    """Whether a configuration's context knobs hold what :func:`limits` found needed (a context
    of 0 or unset means the model's own and is never ruled out)."""
    return not any(_is_number(v := params.get(k)) and 0 < v < n for k, n in need.items())


def ruled_out(values: np.ndarray, need: int) -> np.ndarray:
    """:func:`allowed`'s test on one knob's values (:meth:`autotune.search.pool.Pool.numbers`,
    NaN where inactive), vectorised: True where the context is set and below the need."""
    with np.errstate(invalid="ignore"):
        return (values > 0) & (values < need)
