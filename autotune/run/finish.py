"""The end of a study, in one typed path: the candidates and the baseline, their side-by-side
re-measurement (:mod:`autotune.run.remeasure`), one :class:`~autotune.record.summary.StudySummary`
(counts, the winner, the one speed-up, headroom, prediction error), then the exports, MLflow and
the console, all fed from that summary in memory.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING
from typing import Protocol

from autotune.objectives import get_metric
from autotune.output import export
from autotune.record import optuna_study as studylib
from autotune.record import storage
from autotune.record.summary import StudySummary
from autotune.record.summary import Verdict
from autotune.record.summary import prediction_error
from autotune.run import stop
from autotune.run.headroom import energy_note
from autotune.run.headroom import winner_headroom
from autotune.run.remeasure import choose_winner
from autotune.run.remeasure import tail_spikes
from autotune.search import trials as trialslib
from autotune.search.design import config_key
from autotune.search.select import pareto_front
from autotune.search.select import rank

if TYPE_CHECKING:
    from pathlib import Path

    import optuna

    from autotune.config.schema import Config
    from autotune.output.report import Reporter
    from autotune.record.tracking import Tracker
    from autotune.run.clock import Clock
    from autotune.run.launcher import Launcher
    from autotune.run.placement import Placement
    from autotune.search.space import Space
    from autotune.search.trials import Record


class Driver(Protocol):
    """What the end of a study reads of :class:`autotune.run.driver.Driver`."""

    cfg: Config
    space: Space
    launcher: Launcher
    placement: Placement
    report: Reporter
    tracker: Tracker | None
    dir: Path
    clock: Clock
    stop_reason: str | None
    stopped: KeyboardInterrupt | None


def baseline_record(recs: list[Record]) -> Record | None:
    """Trial 0's measurement (or that of its re-run after a stop)."""
    first = next((r for r in recs if r.number == 0), None)
    if first is None:
        return None
    key = config_key(first.params)
    return next((r for r in recs if r.kind == trialslib.LAUNCHED and config_key(r.params) == key), None)


def candidates(cfg: Config, recs: list[Record]) -> tuple[list[Record], list[Record]]:
    """The records the winner is chosen among, and the measured-feasible Pareto front. The
    winner is the best feasible by the selection rule: any measured trial for ``max`` in
    single mode, the Pareto front otherwise (knee/weighted are front notions)."""
    measured = [r for r in recs if r.kind == trialslib.LAUNCHED]
    front = pareto_front(measured, [o.metric for o in cfg.objectives])
    single_max = cfg.study.search == "single" and cfg.select.rule == "max"
    return ([r for r in measured if r.feasible] if single_max else front), front


def remeasure(cfg: Config, launcher: Launcher, report: Reporter, recs: list[Record]) -> Verdict:
    """The candidates re-measured side by side with the baseline, with the trials that broke
    only a tail-latency bound by one slow request (:func:`~autotune.run.remeasure.tail_spikes`)."""
    measured = [r for r in recs if r.kind == trialslib.LAUNCHED]
    suspects = tail_spikes(measured, cfg.constraints)
    verdict = choose_winner(cfg, launcher, report, candidates(cfg, recs)[0], baseline_record(recs), suspects)
    if verdict.winner is None and (why := unmet(cfg, measured)):
        verdict = dataclasses.replace(verdict, note=f"{verdict.note}; {why}")
    return verdict


def unmet(cfg: Config, measured: list[Record]) -> str:
    """The bounds every measured trial broke, each with the closest value measured: what to
    loosen on a box slower than the preset assumed (an absolute TTFT bound, say)."""
    out = []
    for c in cfg.constraints:
        seen = [(r.violations[str(c)], r) for r in measured
                if str(c) in r.violations and c.metric in r.metrics]
        if seen and all(v > 0 for v, _ in seen):
            _, closest = min(seen, key=lambda x: x[0])
            out.append(f"every measured trial broke {c} (the closest: {closest.metrics[c.metric]:.4g}, "
                       f"trial #{closest.number})")
    if out:
        return "; ".join(out) + f"; loosen {'it' if len(out) == 1 else 'them'} to tune on this box"
    judged = [r for r in measured if any(str(c) in r.violations and c.metric in r.metrics for c in cfg.constraints)]
    broke = [(c, sum(r.violations.get(str(c), 0.0) > 0 and c.metric in r.metrics for r in judged))
             for c in cfg.constraints]
    if not any(n for _, n in broke):
        return ""
    return ("no measured trial met every bound, though each bound was met by some: "
            + ", ".join(f"{c} broken by {n} of {len(judged)}" for c, n in broke if n)
            + "; loosen one of them (or widen the space) to tune on this box")


def summarize(d: Driver, study: optuna.Study, recs: list[Record], verdict: Verdict,
              interrupted: bool, elapsed: float) -> StudySummary:
    """The study's summary: the re-measured winner (else the search's), the one speed-up over
    the baseline (re-measured side by side, else the search's numbers), headroom, counts."""
    cfg, sel = d.cfg, d.cfg.select
    measured = [r for r in recs if r.kind == trialslib.LAUNCHED]
    objectives = [o.metric for o in cfg.objectives]
    cands, front = candidates(cfg, recs)
    ranked = rank(cands, sel.rule, sel.metric, objectives, sel.weights)
    winner = verdict.winner or (ranked[0] if ranked else None)
    baseline = verdict.baseline_remeasured or baseline_record(recs)
    speedup, source = verdict.speedup, verdict.speedup_source
    if winner and baseline and speedup is None:
        speedup = get_metric(sel.metric).speedup(winner.metrics.get(sel.metric),
                                                 baseline.metrics.get(sel.metric))
        source = "search" if speedup is not None else source
    attrs = {t.number: trialslib.trial_attrs(t) for t in study.get_trials(deepcopy=False)}
    return StudySummary(
        study=cfg.study.name, engine=cfg.engine.kind, interrupted=interrupted, search=cfg.study.search,
        n_trials=len(measured), n_rejected=sum(r.kind == trialslib.REJECTED for r in recs),
        n_duplicates=sum(r.kind == trialslib.DUPLICATE for r in recs),
        n_feasible=sum(r.feasible for r in measured),
        n_failed=sum(r.status in ("failed", "timeout") for r in measured),
        n_infeasible=sum(r.status == "infeasible" or (r.status == "ok" and not r.feasible) for r in measured),
        n_stopped=sum(r.status == "stopped" for r in measured),
        elapsed_s=round(elapsed, 1), overhead_s=round(d.clock.overhead_s(), 1),
        objectives=objectives, constraints=[c.describe() for c in cfg.constraints],
        workload=cfg.workload.to_dict(), baseline=baseline, winner=winner, pareto=[r.number for r in front],
        winner_metrics=winner.metrics if winner else {},
        warnings=d.space.engine.export_warnings(winner.params, cfg.engine.settings) if winner else [],
        remeasured=verdict.remeasured, lead_within_noise=verdict.lead_within_noise,
        runner_up=verdict.runner_up, speedup=speedup, speedup_source=source,
        speedup_within_noise=verdict.speedup_within_noise, note=verdict.note, stop_reason=d.stop_reason,
        headroom=winner_headroom(cfg.engine.kind, winner, attrs[winner.number].prediction
                                 if winner and winner.number in attrs else None,
                                 energy_note(d.launcher.workdir(winner.number)) if winner else ""),
        prediction=prediction_error([(attrs[r.number].prediction, r.metrics)
                                     for r in measured if r.status == "ok"
                                     and attrs[r.number].prediction is not None]),
    )


def finish(d: Driver, study: optuna.Study, interrupted: bool,
           elapsed: float) -> tuple[StudySummary, KeyboardInterrupt | None]:
    """Re-measure (unless the study was interrupted), summarise, export, tell MLflow, print.

    Returns the summary (as ``summary.json`` holds it, with the export checks' notes: what
    MLflow, the console and the report after the run read) and the stop that cut the
    re-measurement short (else ``d.stopped``): the search's winner is exported then."""
    recs = studylib.records(study)
    stopped, verdict = d.stopped, Verdict()
    try:
        if not interrupted:
            verdict = remeasure(d.cfg, d.launcher, d.report, recs)
    except KeyboardInterrupt as e:  # a stop during the re-measurement: export the search's winner
        interrupted, stopped = True, e
        d.placement.stop_all([])  # the re-measurement's trial in flight, on our own Ray
        d.report.warn(f"interrupted ({stop.name(e)}) while re-measuring: exporting the search's winner")
    summary = summarize(d, study, recs, verdict, interrupted, elapsed)
    files, summary = export.write_all(d.dir, d.cfg, d.space, candidates(d.cfg, recs)[1], summary.winner,
                                      summary)
    storage.backup(d.cfg.storage_url)
    if d.tracker:
        d.tracker.finish(summary, files, "KILLED" if interrupted else "FINISHED")
    d.report.summary(summary, files)
    return summary, stopped
