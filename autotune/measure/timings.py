"""Per-request timings -> summarised metrics (TTFT, ITL, TPOT, decode / prefill tok/s, e2e).

Definitions (see docs/metrics.md), per request, times measured from submit:
- TTFT = time of the first output chunk;
- ITL = gaps between consecutive output chunks (one chunk may carry several tokens);
- TPOT = (e2e - TTFT) / (output tokens - 1);
- decode tok/s = (output tokens - 1) / (last chunk - first chunk);
- prefill tok/s = prompt tokens / TTFT;
- e2e = submit to the end of the request.
Token counts are the engine's own (``Generation.output_tokens``), never the number of
streamed chunks.
"""

from __future__ import annotations

from autotune.measure.stats import distribution_metrics
from autotune.measure.stats import summarize
from autotune.measure.types import Generation


def decode_tps(g: Generation) -> float | None:
    """(output tokens - 1) / (last chunk - first chunk), or None if undefined."""
    if g.output_tokens < 2 or len(g.chunk_times) < 2:
        return None
    span = g.chunk_times[-1] - g.chunk_times[0]
    return (g.output_tokens - 1) / span if span > 0 else None


def generation_metrics(gens: list[Generation]) -> dict[str, float]:
    """Per-request timings -> summarised metrics (medians, percentiles, spread)."""
    ttft, decode, tpot, itl, prefill, e2e = [], [], [], [], [], []
    for g in gens:
        e2e.append(g.e2e_s * 1e3)
        if not g.chunk_times:
            continue
        first = g.chunk_times[0]
        ttft.append(first * 1e3)
        if g.prompt_tokens and first > 0:
            prefill.append(g.prompt_tokens / first)
        d = decode_tps(g)
        if d is not None:
            decode.append(d)
        if g.output_tokens > 1 and g.e2e_s > first:
            tpot.append((g.e2e_s - first) * 1e3 / (g.output_tokens - 1))
        itl += [(b - a) * 1e3 for a, b in zip(g.chunk_times, g.chunk_times[1:], strict=False)]
    d = summarize(decode)
    out = {
        "decode_tps": d.median,
        "decode_tps_cv": d.cv_pct,
        "prefill_tps": summarize(prefill).median,
    }
    out |= distribution_metrics("ttft", "ms", ttft)
    out |= distribution_metrics("itl", "ms", itl)
    out |= distribution_metrics("tpot", "ms", tpot)
    out |= distribution_metrics("e2e", "ms", e2e)
    drafted = sum(g.drafted for g in gens)
    if drafted:
        out["accept_rate"] = sum(g.accepted for g in gens) / drafted
    return out
