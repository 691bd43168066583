"""One load level: the sessions of a workload, run at a level, and the level's metrics.

Shared by the fixed-load run (:mod:`autotune.measure.workload`), the SLO search
(:mod:`autotune.measure.slo`) and the context ladder (:mod:`autotune.measure.ladder`).
"""

from __future__ import annotations

import math

from autotune.errors import InfeasibleConfig
from autotune.measure.conversations import from_list
from autotune.measure.conversations import growth_metrics
from autotune.measure.conversations import mixed_requests
from autotune.measure.conversations import multiturn_sessions
from autotune.measure.conversations import single_requests
from autotune.measure.conversations import turn_stats
from autotune.measure.load import MAX_OPEN_LOOP_WORKERS
from autotune.measure.load import LevelRun
from autotune.measure.load import Outcome
from autotune.measure.load import SessionFactory
from autotune.measure.load import fairness_metrics
from autotune.measure.load import goodput
from autotune.measure.load import run_closed
from autotune.measure.load import run_poisson
from autotune.measure.spec import WorkloadSpec
from autotune.measure.timings import decode_tps
from autotune.measure.timings import generation_metrics
from autotune.measure.types import Generation
from autotune.measure.types import Generator


def as_workload(workload: WorkloadSpec | dict) -> WorkloadSpec:
    """The typed workload (tests and older callers may pass a plain mapping)."""
    return workload if isinstance(workload, WorkloadSpec) else WorkloadSpec.from_dict(workload)


def validate_concurrency(engine: Generator, concurrency: int) -> None:
    """Raise InfeasibleConfig if the engine cannot serve ``concurrency`` requests at once."""
    limit = engine.max_concurrency
    if limit is not None and concurrency > limit:
        raise InfeasibleConfig(
            f"workload.concurrency={concurrency}, but engine {engine.name!r} serves at most "
            f"{limit} request(s) at a time; use concurrency <= {limit} or a batching engine"
        )


def warm_up(engine: Generator, wl: WorkloadSpec, prompts: list[str]) -> None:
    """``warmup`` requests, one at a time, from the start of the prompt set (not measured)."""
    for i in range(wl.warmup):
        engine.generate(prompts[i % len(prompts)], wl.max_tokens, wl.ignore_eos)


def sessions_for(wl: WorkloadSpec, prompts: list[str], n: int) -> SessionFactory:
    """The sessions of the workload's shape: conversations, mixed lengths or the prompt set."""
    if wl.turns > 1:
        return multiturn_sessions(prompts, wl.turns, wl.max_tokens, wl.seed + wl.warmup)
    if wl.mix:
        return from_list(mixed_requests(wl.mix, n, wl.seed))
    return from_list(single_requests(prompts, n, wl.max_tokens, offset=wl.warmup))


def n_sessions(wl: WorkloadSpec, level: float) -> int:
    """Sessions measured at a level: ``repeats`` per user, or ``repeats`` s of arrivals."""
    return wl.repeats * max(1, math.ceil(level))


def run_level(engine: Generator, wl: WorkloadSpec, prompts: list[str], level: float,
              deadline: float = math.inf) -> LevelRun:
    """Measure one load level: ``level`` users (closed loop) or ``level`` sessions/s (open)."""
    n = n_sessions(wl, level)
    sessions = sessions_for(wl, prompts, n)
    memory = wl.turns > 1
    if wl.arrival == "poisson":  # an engine serving c at a time gets c in flight; the rest queue
        cap = engine.max_concurrency or MAX_OPEN_LOOP_WORKERS
        return run_poisson(engine, sessions, level, n, wl.seed, deadline, memory, cap,
                           wl.ignore_eos)
    return run_closed(engine, sessions, int(level), n, deadline, memory, wl.ignore_eos)


def level_metrics(run: LevelRun, wl: WorkloadSpec) -> dict[str, float]:
    """Timings of a level's finished requests plus throughput, errors, fairness, goodput."""
    gens = run.gens
    out = generation_metrics(gens) if gens else {}
    if run.wall_s > 0:
        out["aggregate_tps"] = sum(g.output_tokens for g in gens) / run.wall_s
        out["throughput_rps"] = len(gens) / run.wall_s
    out["error_rate"] = run.error_rate
    out |= fairness_metrics(run)
    slo = wl.slo
    if slo.ttft_p95_ms is not None or slo.itl_p95_ms is not None or slo.e2e_p99_ms is not None:
        out |= goodput(run, slo)
    if wl.turns > 1:
        out |= growth_metrics(turn_stats(run.outcomes))
    if run.arrival == "closed":
        kinds = {o.kind for o in run.errors}
        if "oom" in kinds:
            out["oom_at_concurrency"] = run.level
        if "rejected" in kinds:
            out["reject_at_concurrency"] = run.level
    return out


def raw_samples(gens: list[Generation]) -> dict:
    """Per-request samples kept with the result (re-measurement pools them)."""
    decode = [decode_tps(g) for g in gens]
    return {
        "decode_tps": [d for d in decode if d is not None],
        "ttft_ms": [g.chunk_times[0] * 1e3 for g in gens if g.chunk_times],
        "e2e_ms": [g.e2e_s * 1e3 for g in gens],
        "output_tokens": [g.output_tokens for g in gens],
        "prompt_tokens": [g.prompt_tokens for g in gens],
    }


def error_summary(outcomes: list[Outcome]) -> dict:
    """Counts of failed requests by kind and the first few reasons."""
    failed = [o for o in outcomes if not o.ok]
    kinds: dict[str, int] = {}
    for o in failed:
        kinds[o.kind] = kinds.get(o.kind, 0) + 1
    return {"counts": kinds, "first": [o.error[:300] for o in failed[:5]]} if failed else {}
