"""What measurement needs from an engine: the :class:`Generation` record and a protocol.

The consumer owns the protocol (as guidellm's ``BackendInterface``): :mod:`autotune.measure`
times any object that has the members of :class:`Generator` and imports nothing from
:mod:`autotune.engines`; every ``Engine`` satisfies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import Any
from typing import Protocol


@dataclass
class Generation:
    """One request's timing, from the engine's own token counts.

    ``chunk_times`` are seconds since submit at which output arrived; ``output_tokens``
    is the engine's count (a chunk may hold several tokens under speculative decoding).
    """

    prompt_tokens: int
    output_tokens: int
    chunk_times: list[float]
    e2e_s: float
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0


class Generator(Protocol):
    """A started engine as the timing loop and the quality metrics see it.

    ``max_concurrency`` is the most requests it serves at once (None: no limit);
    ``generate`` must be thread-safe when it is above 1. ``context_tokens`` is the trial's
    context length (None: not set, or the engine has none), which the context ladder stays
    within (``Engine`` reads it from its ``context_knob``, ``params`` and ``settings``);
    ``memory`` is sampled after each turn of a conversation.
    """

    name: str
    max_concurrency: int | None

    def generate(self, prompt: str, max_tokens: int, ignore_eos: bool = True) -> Generation:
        """Run one request greedily and time it."""
        ...

    def logprobs(self, text: str, n_tokens: int) -> tuple[list[int], Any]:
        """(token ids, logits rows [n, vocab]) of ``text``'s first ``n_tokens`` tokens."""
        ...

    def context_tokens(self) -> int | None:
        """The trial's context in tokens, or None when it has none the ladder must respect."""
        ...

    def memory(self) -> dict[str, float]:
        """Memory metrics sampled now (peak RSS, peak VRAM); {} when the engine has none."""
        ...
