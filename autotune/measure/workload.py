"""Run a workload against a started engine and turn the timings into metrics.

Definitions (see docs/metrics.md): TTFT = first output chunk - submit; ITL = gaps between
output chunks; TPOT = (e2e - TTFT) / (output tokens - 1); decode tok/s = (output tokens -
1) / (last chunk - first chunk); prefill tok/s = prompt tokens / TTFT. Token counts are
the engine's own, never the number of streamed chunks.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.measure.stats import distribution_metrics
from autotune.measure.stats import summarize

if TYPE_CHECKING:
    from autotune.engines.base import Engine
    from autotune.engines.base import Generation


def prompt_sets() -> list[str]:
    """Names of the prompt sets shipped with autotune."""
    root = resources.files("autotune") / "data" / "prompts"
    return sorted(p.name.removesuffix(".jsonl") for p in root.iterdir() if p.name.endswith(".jsonl"))


def load_prompts(name: str) -> list[str]:
    """A shipped prompt set by name, or a .jsonl ({"prompt": ...} per line) / .txt file path."""
    path = Path(name)
    if not path.suffix:
        path = Path(str(resources.files("autotune") / "data" / "prompts" / f"{name}.jsonl"))
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]
    return [p for p in text.split("\n\n\n") if p.strip()]


def generation_metrics(gens: list[Generation]) -> dict[str, float]:
    """Per-request timings -> summarised metrics (medians, percentiles, spread)."""
    ttft = [g.chunk_times[0] * 1e3 for g in gens if g.chunk_times]
    decode, tpot, itl, prefill, e2e = [], [], [], [], []
    for g in gens:
        e2e.append(g.e2e_s * 1e3)
        if not g.chunk_times:
            continue
        if g.prompt_tokens and g.chunk_times[0] > 0:
            prefill.append(g.prompt_tokens / g.chunk_times[0])
        span = g.chunk_times[-1] - g.chunk_times[0]
        if g.output_tokens > 1 and span > 0:
            decode.append((g.output_tokens - 1) / span)
            tpot.append((g.e2e_s - g.chunk_times[0]) * 1e3 / (g.output_tokens - 1))
        itl += [(b - a) * 1e3 for a, b in zip(g.chunk_times, g.chunk_times[1:])]
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


def run_workload(engine: Engine, workload: dict) -> tuple[dict[str, float], dict]:
    """Warm up, then run the measured repeats; returns (metrics, raw samples)."""
    prompts = load_prompts(workload["prompts"])
    max_tokens = int(workload["max_tokens"])
    ignore_eos = bool(workload.get("ignore_eos", True))
    conc = int(workload.get("concurrency", 1))
    for i in range(int(workload.get("warmup", 1))):
        engine.generate(prompts[i % len(prompts)], max_tokens, ignore_eos)
    gens: list[Generation] = []
    agg: list[float] = []
    start = int(workload.get("warmup", 1))
    for r in range(int(workload["repeats"])):
        batch = [prompts[(start + r * conc + j) % len(prompts)] for j in range(conc)]
        if conc == 1:
            gens.append(engine.generate(batch[0], max_tokens, ignore_eos))
            continue
        t0 = time.perf_counter()
        with ThreadPoolExecutor(conc) as pool:
            round_gens = list(pool.map(lambda p: engine.generate(p, max_tokens, ignore_eos), batch))
        agg.append(sum(g.output_tokens for g in round_gens) / (time.perf_counter() - t0))
        gens += round_gens
    metrics = generation_metrics(gens)
    if agg:
        metrics["aggregate_tps"] = summarize(agg).median
    raw = {
        "decode_tps": [
            (g.output_tokens - 1) / (g.chunk_times[-1] - g.chunk_times[0])
            for g in gens if g.output_tokens > 1 and len(g.chunk_times) > 1
            and g.chunk_times[-1] > g.chunk_times[0]
        ],
        "ttft_ms": [g.chunk_times[0] * 1e3 for g in gens if g.chunk_times],
        "output_tokens": [g.output_tokens for g in gens],
        "prompt_tokens": [g.prompt_tokens for g in gens],
    }
    return metrics, raw
