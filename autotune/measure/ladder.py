"""Long context: a ladder of prompt lengths up to the context the trial has.

For each length L of ``workload.context_ladder`` (increasing) whose L + ``max_tokens``
fits the trial's context (:meth:`~autotune.measure.types.Generator.context_tokens`: the
engine's ``context_knob`` among its parameters or settings), ``repeats`` requests with a
passage of about L tokens run one at a time. The ladder stops at the first length that
fails (OOM, rejection, a context error). The trial reports the timings of the longest
length that worked and ``max_context_tokens`` = the most prompt + output tokens any
request of it held.
"""

from __future__ import annotations

from autotune.errors import InfeasibleConfig
from autotune.measure.conversations import from_list
from autotune.measure.conversations import passage
from autotune.measure.levels import level_metrics
from autotune.measure.levels import raw_samples
from autotune.measure.levels import warm_up
from autotune.measure.load import LevelRun
from autotune.measure.load import Request
from autotune.measure.load import run_closed
from autotune.measure.prompts import load_prompts
from autotune.measure.spec import WorkloadSpec
from autotune.measure.types import Generator

OFFSET_STRIDE = 997  # words between the passages of one length (different text each)


def run_ladder(engine: Generator, wl: WorkloadSpec) -> tuple[dict[str, float], dict]:
    """Climb the ladder; (metrics at the longest length that worked, raw samples + steps)."""
    warm_up(engine, wl, load_prompts(wl.prompts))
    limit = engine.context_tokens()
    steps: list[dict] = []
    best: LevelRun | None = None
    first_error: BaseException | None = None
    for length in wl.context_ladder:
        if limit is not None and length + wl.max_tokens > limit:
            steps.append({"prompt_tokens": length, "status": f"skipped: context {limit}"})
            continue
        reqs = [Request(passage(length, i * OFFSET_STRIDE), wl.max_tokens) for i in range(wl.repeats)]
        try:
            run = run_closed(engine, from_list(reqs), 1, len(reqs), ignore_eos=wl.ignore_eos)
        except InfeasibleConfig as e:  # e.g. a server refusing a prompt longer than it holds
            if best is None:
                raise
            steps.append({"prompt_tokens": length, "status": f"failed: {e}"[:300]})
            break
        if run.errors:
            first_error = first_error or run.errors[0].exc
            steps.append({"prompt_tokens": length, "status": f"failed: {run.errors[0].error}"[:300]})
            break
        steps.append({"prompt_tokens": length, "status": "ok",
                      "ttft_p50_ms": level_metrics(run, wl).get("ttft_p50_ms")})
        best = run
    if best is None:
        if first_error is not None:
            raise first_error
        raise InfeasibleConfig(
            f"no length of workload.context_ladder {list(wl.context_ladder)} fits the trial's "
            f"context ({limit} tokens) with {wl.max_tokens} new tokens")
    metrics = level_metrics(best, wl)
    metrics["max_context_tokens"] = float(max(g.prompt_tokens + g.output_tokens for g in best.gens))
    return metrics, raw_samples(best.gens) | {"concurrency": 1, "ladder": steps}
