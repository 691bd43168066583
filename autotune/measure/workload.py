"""Run a workload against a started engine and turn the timings into metrics.

Definitions (see docs/metrics.md), per request, times measured from submit:
- TTFT = time of the first output chunk;
- ITL = gaps between consecutive output chunks (one chunk may carry several tokens);
- TPOT = (e2e - TTFT) / (output tokens - 1);
- decode tok/s = (output tokens - 1) / (last chunk - first chunk);
- prefill tok/s = prompt tokens / TTFT;
- e2e = submit to the end of the request.
Token counts are the engine's own (``Generation.output_tokens``), never the number of
streamed chunks. With ``concurrency`` c > 1, c requests are kept in flight by c threads
(closed loop) and ``aggregate_tps`` = all output tokens / wall time of the measured part.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field
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
    """A shipped prompt set by name, or a .jsonl ({"prompt": ...} per line) / .txt file path.

    A ``.txt`` file holds prompts separated by two blank lines.
    """
    path = Path(name)
    if not path.suffix:
        path = Path(str(resources.files("autotune") / "data" / "prompts" / f"{name}.jsonl"))
        if not path.exists():
            raise FileNotFoundError(
                f"unknown prompt set {name!r}: expected one of {', '.join(prompt_sets())} "
                "or a path to a .jsonl / .txt file"
            )
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]
    return [p for p in text.split("\n\n\n") if p.strip()]


@dataclass
class WorkloadRun:
    """The measured requests of one workload (warm-up excluded), in submission order."""

    prompts: list[str]
    gens: list[Generation]
    wall_s: float
    concurrency: int = 1
    max_tokens: int = 0
    ignore_eos: bool = True
    extra: dict = field(default_factory=dict)


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


def check_concurrency(engine: Engine, concurrency: int) -> None:
    """Raise InfeasibleConfig if the engine cannot serve ``concurrency`` requests at once."""
    from autotune.engines.base import InfeasibleConfig

    limit = getattr(engine, "max_concurrency", None)
    if limit is not None and concurrency > limit:
        raise InfeasibleConfig(
            f"workload.concurrency={concurrency}, but engine {engine.name!r} serves at most "
            f"{limit} request(s) at a time; use concurrency <= {limit} or a batching engine"
        )


def collect(engine: Engine, workload: dict) -> WorkloadRun:
    """Warm up, then run the measured repeats; the raw generations, warm-up excluded.

    ``repeats`` measured requests are sent with concurrency 1; with concurrency c,
    ``repeats * c`` requests go through c threads that each keep one request in flight.
    Prompts are taken in order from the set (cycling), starting after the warm-up ones.
    """
    prompts = load_prompts(workload["prompts"])
    max_tokens = int(workload["max_tokens"])
    ignore_eos = bool(workload.get("ignore_eos", True))
    conc = int(workload.get("concurrency", 1))
    warmup = int(workload.get("warmup", 1))
    check_concurrency(engine, conc)
    for i in range(warmup):
        engine.generate(prompts[i % len(prompts)], max_tokens, ignore_eos)
    n = int(workload["repeats"]) * conc
    chosen = [prompts[(warmup + i) % len(prompts)] for i in range(n)]
    t0 = time.perf_counter()
    if conc == 1:
        gens = [engine.generate(p, max_tokens, ignore_eos) for p in chosen]
    else:
        with ThreadPoolExecutor(conc) as pool:
            gens = list(pool.map(lambda p: engine.generate(p, max_tokens, ignore_eos), chosen))
    wall = time.perf_counter() - t0
    return WorkloadRun(chosen, gens, wall, conc, max_tokens, ignore_eos)


def summarize_run(run: WorkloadRun) -> tuple[dict[str, float], dict]:
    """(metrics, raw per-request samples) of a collected run."""
    metrics = generation_metrics(run.gens)
    total = sum(g.output_tokens for g in run.gens)
    if run.wall_s > 0:
        metrics["aggregate_tps"] = total / run.wall_s
    decode = [decode_tps(g) for g in run.gens]
    raw = {
        "decode_tps": [d for d in decode if d is not None],
        "ttft_ms": [g.chunk_times[0] * 1e3 for g in run.gens if g.chunk_times],
        "e2e_ms": [g.e2e_s * 1e3 for g in run.gens],
        "output_tokens": [g.output_tokens for g in run.gens],
        "prompt_tokens": [g.prompt_tokens for g in run.gens],
        "concurrency": run.concurrency,
    }
    return metrics, raw


def run_workload(engine: Engine, workload: dict) -> tuple[dict[str, float], dict]:
    """Warm up, then run the measured repeats; returns (metrics, raw samples)."""
    return summarize_run(collect(engine, workload))
