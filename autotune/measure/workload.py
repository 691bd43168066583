"""Run a workload against a started engine and turn the timings into metrics.

``run_workload`` picks the form the workload declares (docs/metrics.md defines every
metric and the load it is measured at):

- a fixed load (``load: fixed``): warm-up, then ``repeats`` sessions per user at
  ``concurrency`` users (closed loop) or about ``repeats`` seconds of Poisson arrivals
  at ``rate`` (open loop);
- the most load that meets the SLO (``load: slo``): :mod:`autotune.measure.slo`;
- a context ladder (``context_ladder``): :mod:`autotune.measure.ladder`.

Per-request timing definitions are in :mod:`autotune.measure.timings`; the sessions
(single-turn, mixed lengths, multi-turn) in :mod:`autotune.measure.conversations`; the
arrival processes in :mod:`autotune.measure.load`.
"""

from __future__ import annotations

from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field

from autotune.measure import early_stop
from autotune.measure.conversations import turn_stats
from autotune.measure.ladder import run_ladder
from autotune.measure.levels import as_workload
from autotune.measure.levels import error_summary
from autotune.measure.levels import level_metrics
from autotune.measure.levels import n_sessions
from autotune.measure.levels import raw_samples
from autotune.measure.levels import run_level
from autotune.measure.levels import sessions_for
from autotune.measure.levels import validate_concurrency
from autotune.measure.levels import warm_up
from autotune.measure.load import LevelRun
from autotune.measure.load import Outcome
from autotune.measure.load import run_closed
from autotune.measure.prompts import load_prompts
from autotune.measure.prompts import prompt_sets
from autotune.measure.slo import run_slo_search
from autotune.measure.spec import WorkloadSpec
from autotune.measure.timings import decode_tps
from autotune.measure.timings import generation_metrics
from autotune.measure.types import Generation
from autotune.measure.types import Generator

__all__ = [
    "WorkloadRun", "as_workload", "run_staged", "validate_concurrency", "collect", "decode_tps",
    "generation_metrics", "level_metrics", "load_prompts", "prompt_sets", "run_workload",
    "summarize_run",
]


@dataclass
class WorkloadRun:
    """The measured requests of one workload (warm-up excluded), in completion order."""

    prompts: list[str]
    gens: list[Generation]
    wall_s: float
    concurrency: int = 1
    max_tokens: int = 0
    ignore_eos: bool = True
    extra: dict = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)
    workload: WorkloadSpec | None = None
    level: LevelRun | None = None
















def collect(engine: Generator, workload: WorkloadSpec | dict) -> WorkloadRun:
    """A fixed load: warm up, then measure one level; the raw generations, warm-up excluded.

    Failed requests are counted (``error_rate``); if every request failed, the first
    failure is raised so the trial fails with its reason.
    """
    wl = as_workload(workload)
    prompts = load_prompts(wl.prompts)
    level = wl.rate if wl.arrival == "poisson" else wl.concurrency
    if wl.arrival == "closed":
        validate_concurrency(engine, wl.concurrency)
    warm_up(engine, wl, prompts)
    rule = early_stop.active()
    staged = rule is not None and wl.arrival == "closed"
    run = run_staged(engine, wl, prompts, rule) if staged else run_level(engine, wl, prompts, level)
    if run.outcomes and not run.gens and run.errors[0].exc is not None:
        raise run.errors[0].exc
    ok = [o for o in run.outcomes if o.ok]
    return WorkloadRun([o.prompt for o in ok], [o.gen for o in ok], run.wall_s, wl.concurrency, wl.max_tokens,
                       wl.ignore_eos, outcomes=run.outcomes, workload=wl, level=run)






def run_staged(engine: Generator, wl: WorkloadSpec, prompts: list[str],
               rule: early_stop.StopRule) -> LevelRun:
    """A closed-loop level in two stages: the first batch of sessions, judged by ``rule``
    (:func:`autotune.measure.early_stop.verdict`; raises ``StoppedEarly`` with the partial
    numbers), then the rest; the same sessions, in the same order, as one ``run_level``."""
    n = n_sessions(wl, wl.concurrency)
    k = early_stop.first_batch(n)
    if k and k < wl.concurrency:  # the first batch keeps every user busy, or there is none
        k = wl.concurrency if wl.concurrency < n else 0
    sessions = sessions_for(wl, prompts, n)
    memory = wl.turns > 1
    first = run_closed(engine, sessions, wl.concurrency, k or n, sample_memory=memory,
                       ignore_eos=wl.ignore_eos)
    if not k:
        return first
    metrics, raw = summarize_run(WorkloadRun([o.prompt for o in first.outcomes if o.ok], first.gens,
                                             first.wall_s, wl.concurrency, wl.max_tokens, wl.ignore_eos,
                                             outcomes=first.outcomes, workload=wl, level=first))
    why = early_stop.verdict(rule, {**metrics, **engine.memory()}, raw)
    if why:
        raise early_stop.StoppedEarly(why, metrics, raw)
    rest = run_closed(engine, lambda i: sessions(i + k), wl.concurrency, n - k, sample_memory=memory,
                      ignore_eos=wl.ignore_eos)
    for o in rest.outcomes:
        o.session += k
    return LevelRun(first.level, "closed", first.outcomes + rest.outcomes, first.wall_s + rest.wall_s)


def summarize_run(run: WorkloadRun) -> tuple[dict[str, float], dict]:
    """(metrics, raw per-request samples) of a collected run."""
    if run.level is not None and run.workload is not None:
        metrics = level_metrics(run.level, run.workload)
    else:  # a run assembled by hand from generations
        metrics = generation_metrics(run.gens)
        if run.wall_s > 0:
            metrics["aggregate_tps"] = sum(g.output_tokens for g in run.gens) / run.wall_s
    raw = raw_samples(run.gens) | {"concurrency": run.concurrency}
    if run.workload is not None and run.workload.turns > 1:
        raw["per_turn"] = [asdict(t) for t in turn_stats(run.outcomes)]
    if run.outcomes and error_summary(run.outcomes):
        raw["errors"] = error_summary(run.outcomes)
    return metrics, raw


def run_workload(engine: Generator, workload: WorkloadSpec | dict) -> tuple[dict[str, float], dict]:
    """Run the workload in the form it declares; returns (metrics, raw samples)."""
    wl = as_workload(workload)
    if wl.context_ladder:
        return run_ladder(engine, wl)
    if wl.load == "slo":
        return run_slo_search(engine, wl)
    return summarize_run(collect(engine, wl))
