"""What a search trial is told about stopping early (``study.early_stop``, issue 43).

The driver sends each search trial a :class:`~autotune.measure.spec.StopRule`: the
constraints as bounds and, in a single-objective search that picks the winner by one
metric (``select.rule: max``), that metric and the incumbent (the best feasible value
measured so far). The worker stops the trial after a stage when a bound is broken beyond
noise or the objective cannot reach the incumbent (:mod:`autotune.measure.early_stop`); the
driver tells it PRUNED (:func:`autotune.record.optuna_study.tell`).

Never stopped early: trial 0 (the baseline the speed-up is measured against), the quality
reference and the end-of-study re-measurement (they never get a rule), and trials of a
sampler that ignores Optuna's PRUNED trials (``gp`` and ``nsga2`` read COMPLETE trials only,
so a stopped trial would teach them nothing and could be proposed again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from autotune.measure.spec import StopRule
from autotune.objectives import get_metric
from autotune.search.samplers import resolve
from autotune.search.trials import trial_attrs

if TYPE_CHECKING:
    from collections.abc import Iterable

    from autotune.config.schema import Config
    from autotune.search.trials import Record

LEARNS_FROM_PRUNED = ("bo", "tpe", "random", "grid")  # samplers that read PRUNED trials (or none)


def enabled(cfg: Config) -> bool:
    """Whether search trials may stop early: ``study.early_stop`` and a sampler that learns
    from PRUNED trials."""
    st = cfg.study
    return st.early_stop and resolve(st.sampler, st.search, len(cfg.objectives)) in LEARNS_FROM_PRUNED


def incumbent(cfg: Config, measured: Iterable[Record]) -> tuple[float, int] | None:
    """(value, trial) of the best feasible search measurement of the winner's metric (a single
    search with ``select.rule: max``), or None (no such search, or nothing feasible yet)."""
    if cfg.study.search != "single" or cfg.select.rule != "max":
        return None
    metric = get_metric(cfg.select.metric)
    best = None
    for r in measured:
        value = r.metrics.get(cfg.select.metric)
        if r.feasible and r.status == "ok" and value is not None and (
                best is None or metric.better(value, best[0])):
            best = (value, r.number)
    return best


def stop_rule(cfg: Config, trial: Any, measured: Iterable[Record]) -> StopRule | None:
    """The rule for search trial ``trial`` (an ``optuna.Trial``), None when it runs to the end."""
    a = trial_attrs(trial)
    if not enabled(cfg) or trial.number == 0 or a.role == "baseline" or a.rerun_of == 0:
        return None  # trial 0, or trial 0 re-run on resume after a stop cut it off
    bounds = tuple((c.metric, c.op, float(c.bound)) for c in cfg.constraints if c.known)
    best = incumbent(cfg, measured)
    if best is None:
        return StopRule(bounds=bounds) if bounds else None
    maximize = get_metric(cfg.select.metric).direction == "maximize"
    return StopRule(cfg.select.metric, maximize, best[0], best[1], bounds)
