"""Sessions for the workload shapes: single-turn, mixed lengths, multi-turn and long context.

- single-turn: the prompt set in order (cycling), one request per session;
- ``mix``: each request draws a class (prompt / output tokens) by weight from
  ``numpy.random.default_rng(seed)`` and a passage of that length from the shipped text,
  so the same seed always gives the same requests;
- ``turns`` > 1: a session is a conversation; turn t's prompt is the whole history (every
  earlier user message and answer) plus the new user message, so it grows every turn and
  prefix caching and KV growth show;
- ``context_ladder``: one long passage per length, up to the trial's context.

Token targets are reached without a tokenizer: passages are cut by words at the
tokens-per-word ratio of the shipped prompt sets (which store their gemma-3 token counts),
and every metric uses the engine's own token counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from autotune.measure.load import Request
from autotune.measure.load import Session
from autotune.measure.load import SessionFactory
from autotune.measure.quality import load_text
from autotune.measure.timings import decode_tps
from autotune.measure.types import Generation

INSTRUCTION = "Summarise the following passage in plain words.\n\n"


@lru_cache(maxsize=1)
def tokens_per_word() -> float:
    """Tokens per whitespace word in the shipped prompt sets (their stored token counts)."""
    tokens = words = 0
    for name in ("short", "medium", "long"):
        path = resources.files("autotune") / "data" / "prompts" / f"{name}.jsonl"
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                tokens += int(row["tokens"])
                words += len(row["prompt"].split())
    return tokens / words


@lru_cache(maxsize=1)
def _words() -> tuple[str, ...]:
    return tuple(load_text("gpl3").split())


def passage(n_tokens: int, offset: int = 0) -> str:
    """An instruction plus shipped prose of about ``n_tokens`` tokens, from word ``offset``."""
    words = _words()
    n = max(1, int((n_tokens - 12) / tokens_per_word()))
    picked = [words[(offset + i) % len(words)] for i in range(n)]
    return INSTRUCTION + " ".join(picked)


def single_requests(prompts: list[str], n: int, max_tokens: int, offset: int = 0) -> list[Request]:
    """``n`` requests taking the prompt set in order from ``offset`` (cycling)."""
    return [Request(prompts[(offset + i) % len(prompts)], max_tokens) for i in range(n)]


def mixed_requests(mix, n: int, seed: int) -> list[Request]:
    """``n`` requests drawn from the mix classes by weight; a pure function of ``seed``."""
    rng = np.random.default_rng(seed)
    weights = np.array([m.weight for m in mix], dtype=float)
    classes = rng.choice(len(mix), size=n, p=weights / weights.sum())
    offsets = rng.integers(0, len(_words()), size=n)
    return [Request(passage(mix[c].prompt_tokens, int(o)), int(mix[c].output_tokens))
            for c, o in zip(classes, offsets, strict=True)]


def from_list(requests: list[Request]) -> SessionFactory:
    """Session k sends ``requests[k]`` (cycling): one request per session."""

    def session(index: int) -> Session:
        yield requests[index % len(requests)]

    return session


def answer_text(gen: Generation | None) -> str:
    """What the assistant said, as resent in the history (word stand-ins when an engine
    returns no text, one per output token, so the history still grows by the answer)."""
    if gen is None:
        return ""
    return gen.text if gen.text.strip() else " ".join(["ok"] * max(1, gen.output_tokens))


def conversation(messages: list[str], max_tokens: int) -> Session:
    """One conversation: turn t sends the history of turns 1..t-1 plus ``messages[t-1]``."""
    history = ""
    for turn, message in enumerate(messages, start=1):
        prompt = f"{history}User: {message}\nAssistant:"
        gen = yield Request(prompt, max_tokens, turn)
        history = f"{prompt} {answer_text(gen).strip()}\n"


def multiturn_sessions(prompts: list[str], turns: int, max_tokens: int, seed: int = 0) -> SessionFactory:
    """Conversation k uses the user messages k*turns + seed, ... of the prompt set (cycling)."""

    def session(index: int) -> Session:
        start = index * turns + seed
        return conversation([prompts[(start + t) % len(prompts)] for t in range(turns)], max_tokens)

    return session


@dataclass(frozen=True)
class TurnStats:
    """Medians over the conversations of one turn (1-based)."""

    turn: int
    n: int
    prompt_tokens: float
    ttft_ms: float
    decode_tps: float
    e2e_ms: float
    memory_mb: float | None


def _memory_mb(memory: dict[str, float]) -> float | None:
    if "vram_peak_gb" in memory:
        return memory["vram_peak_gb"] * 1024.0
    return memory.get("peak_rss_mb")


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")


def turn_stats(outcomes) -> list[TurnStats]:
    """Per-turn medians of prompt tokens, TTFT, decode tok/s, e2e and memory after the turn."""
    by_turn: dict[int, list] = {}
    for o in outcomes:
        if o.ok:
            by_turn.setdefault(o.turn, []).append(o)
    out = []
    for turn in sorted(by_turn):
        rows = by_turn[turn]
        mems = [m for m in (_memory_mb(o.memory) for o in rows) if m is not None]
        decodes = [d for d in (decode_tps(o.gen) for o in rows) if d is not None]
        out.append(TurnStats(
            turn, len(rows), _median([o.gen.prompt_tokens for o in rows]),
            _median([o.gen.chunk_times[0] * 1e3 for o in rows if o.gen.chunk_times]),
            _median(decodes), _median([o.gen.e2e_s * 1e3 for o in rows]),
            max(mems) if mems else None))
    return out


def growth_metrics(stats: list[TurnStats]) -> dict[str, float]:
    """Turn 1 -> last turn: TTFT growth %, decode tok/s change %, memory growth per turn."""
    if len(stats) < 2:
        return {}
    first, last = stats[0], stats[-1]
    out = {"ttft_turn1_ms": first.ttft_ms, "ttft_last_turn_ms": last.ttft_ms}
    if first.ttft_ms > 0:
        out["ttft_growth_pct"] = 100.0 * (last.ttft_ms / first.ttft_ms - 1.0)
    if first.decode_tps > 0:
        out["decode_tps_growth_pct"] = 100.0 * (last.decode_tps / first.decode_tps - 1.0)
    if first.memory_mb is not None and last.memory_mb is not None:
        out["mem_growth_mb_per_turn"] = (last.memory_mb - first.memory_mb) / (last.turn - first.turn)
    return {k: v for k, v in out.items() if v == v}  # drop NaN
