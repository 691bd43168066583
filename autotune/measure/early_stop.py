"""Stop a trial as soon as it cannot win (issue 43): the decision, from the samples so far.

A trial is measured in stages: the first batch of requests (:func:`first_batch`), then the
rest of the workload, then the quality pass. After each of the first two, :func:`verdict`
says whether to stop, and why:

- a **bound** (a constraint) is broken beyond noise: the bootstrap 95% CI of the median of the
  metric's per-request samples lies wholly past the bound, by more than ``TOLERANCE`` of it
  (a tail bound such as ``ttft_p95_ms <= 200`` is judged on the median: a tail is at least the
  median, and a spike over a good median is never a reason to stop); a peak-memory bound
  (``*peak*``) already exceeded (a peak only grows);
- the **objective cannot reach the incumbent**: its optimistic bound is worse than the best
  feasible value measured so far by more than ``TOLERANCE``. The optimistic bound is the better
  end of a 95% t-interval (n-1 degrees of freedom) around the median of the per-request samples,
  on their logarithms, widened by the run-to-run noise (``RUN_NOISE``): a trial's level moves
  between runs (and the incumbent, the best of several noisy runs, reads high), which no
  bootstrap of 2-5 requests of one run can see, so that noise is taken as large as one
  request's spread. With 2 requests the interval is wide (t = 12.7), so the first batch stops
  only a trial far from the incumbent; a bootstrap of 2 requests was [min, max] and stopped
  configurations truly better than the incumbent (issue 43: 102 of 920 stops on 70B EXL2).

Only metrics read from per-request samples (``decode_tps``, ``ttft_*_ms``, ``e2e_*_ms``) are
judged from samples, and never from fewer than ``MIN_SAMPLES``. The worker raises
:class:`StoppedEarly` with the partial numbers; the driver records the trial as Optuna's
PRUNED (:mod:`autotune.record.optuna_study`).

The rule reaches the timing loop through :func:`stages` (a context variable the worker sets
around ``Engine.measure``), so engines keep their ``measure(workload)`` signature; an engine
with its own loop (``command``) is judged once, after its workload.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import statistics
from collections.abc import Iterator

from autotune.measure.spec import StopRule
from autotune.measure.stats import bootstrap_ci

TOLERANCE = 0.05  # a trial within 5% of the incumbent (or a bound) is measured to the end
MIN_SAMPLES = 2
INTERVAL = "t"  # the objective's interval: "t" (log samples, n-1 dof) or "bootstrap" (issue 43's first rule)
RUN_NOISE = 1.0  # run-to-run variance of a trial's level, in units of one request's (0: none)
MIN_OBJECTIVE_SAMPLES = 2  # fewer samples never stop on the objective
PREFIX = "stopped early: "

_RULE: contextvars.ContextVar[StopRule | None] = contextvars.ContextVar("early_stop", default=None)


class StoppedEarly(Exception):  # noqa: N818 - a stop, not an error
    """Raised by the timing loop after a stage: the reason and the partial (metrics, raw)."""

    def __init__(self, reason: str, metrics: dict[str, float], raw: dict) -> None:
        super().__init__(reason)
        self.reason, self.metrics, self.raw = reason, metrics, raw


@contextlib.contextmanager
def stages(rule: StopRule | None) -> Iterator[None]:
    """Measure in stages under ``rule`` inside the block (None: one stage, never stopped)."""
    token = _RULE.set(rule)
    try:
        yield
    finally:
        _RULE.reset(token)


def active() -> StopRule | None:
    """The rule of the enclosing :func:`stages` block, if any."""
    return _RULE.get()


def first_batch(n: int) -> int:
    """Requests in the first stage of ``n``: a third, at least ``MIN_SAMPLES`` (0: no stage)."""
    k = max(MIN_SAMPLES, math.ceil(n / 3))
    return k if k < n else 0


def samples_for(metric: str, raw: dict) -> list[float] | None:
    """The per-request samples a metric is read from (None: not a per-request metric)."""
    parts = metric.split("_")
    if metric == "decode_tps":
        key = "decode_tps"
    elif len(parts) == 3 and parts[0] in ("ttft", "e2e") and parts[1] in ("p50", "p95", "p99") \
            and parts[2] == "ms":
        key = f"{parts[0]}_ms"
    else:
        return None
    if key not in raw:
        return None
    return [float(x) for x in raw[key] if x is not None and math.isfinite(x)]


def _median_ci(xs: list[float]) -> tuple[float, float]:
    return bootstrap_ci(xs)


def t975(dof: int) -> float:
    """The two-sided 95% Student t quantile with ``dof`` degrees of freedom (>= 1)."""
    from scipy.stats import t  # here: the worker pays the import only when it judges samples

    return float(t.ppf(0.975, dof))


def level_interval(xs: list[float]) -> tuple[float, float]:
    """95% interval of a trial's level (its median) from its per-request samples: a t-interval
    on the log samples (n-1 dof) around the log median, widened by ``RUN_NOISE`` (the run-to-run
    variance in units of one request's); ``INTERVAL == "bootstrap"``: the bootstrap CI of the
    median (issue 43's first rule)."""
    if INTERVAL == "bootstrap" or len(xs) < 2 or min(xs) <= 0:
        return _median_ci(xs)
    logs = [math.log(x) for x in xs]
    half = t975(len(xs) - 1) * statistics.stdev(logs) * math.sqrt(1.0 / len(xs) + RUN_NOISE)
    mid = math.log(statistics.median(xs))
    return math.exp(mid - half), math.exp(mid + half)


def _bound(metric: str, op: str, bound: float, metrics: dict[str, float], raw: dict) -> str | None:
    xs = samples_for(metric, raw)
    slack = TOLERANCE * abs(bound)
    if xs is None:
        value = metrics.get(metric)
        if "peak" in metric and op == "<=" and value is not None and value > bound + slack:
            return f"{metric} already {value:.4g} > {bound:g} (a peak only grows)"
        return None
    if len(xs) < MIN_SAMPLES:
        return None
    lo, hi = _median_ci(xs)
    if op == "<=" and lo > bound + slack:
        return (f"{metric} <= {bound:g} broken beyond noise: the median of {len(xs)} requests is "
                f"at least {lo:.4g} (95% CI)")
    if op == ">=" and hi < bound - slack:
        return (f"{metric} >= {bound:g} broken beyond noise: the median of {len(xs)} requests is "
                f"at most {hi:.4g} (95% CI)")
    return None


def _objective(rule: StopRule, raw: dict) -> str | None:
    if rule.objective is None or rule.incumbent is None:
        return None
    xs = samples_for(rule.objective, raw)
    if xs is None or len(xs) < max(MIN_SAMPLES, MIN_OBJECTIVE_SAMPLES):
        return None
    lo, hi = level_interval(xs)
    inc, slack = rule.incumbent, TOLERANCE * abs(rule.incumbent)
    by = f" (trial #{rule.incumbent_trial})" if rule.incumbent_trial is not None else ""
    if rule.maximize and hi < inc - slack:
        return (f"{rule.objective} at most {hi:.4g} (95% CI of the median of {len(xs)} requests) "
                f"cannot reach the incumbent {inc:.4g}{by}")
    if not rule.maximize and lo > inc + slack:
        return (f"{rule.objective} at least {lo:.4g} (95% CI of the median of {len(xs)} requests) "
                f"cannot reach the incumbent {inc:.4g}{by}")
    return None


def verdict(rule: StopRule | None, metrics: dict[str, float], raw: dict) -> str | None:
    """Why to stop now (``"stopped early: ..."``), or None to go on, from the numbers so far."""
    if rule is None:
        return None
    for metric, op, bound in rule.bounds:
        why = _bound(metric, op, bound, metrics, raw)
        if why:
            return PREFIX + why
    why = _objective(rule, raw)
    return PREFIX + why if why else None
