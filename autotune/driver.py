"""The ask/tell loop: ask -> place on Ray -> wait for one -> tell + log -> refill.

Up to N trials are in flight (``ray.max_concurrent`` or what the cluster holds); as soon as
one finishes it is told and the next is asked for, with no batch barrier. A proposal that
breaks a rule is told infeasible without starting an engine. Every wait has a timeout,
so a lost worker costs one trial, never the study.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import yaml

from autotune import study as studylib
from autotune.measure.quality import reference_ready
from autotune.samplers import make_sampler
from autotune.space import baseline_params
from autotune.trial.spec import TrialResult
from autotune.trial.spec import TrialSpec

if TYPE_CHECKING:
    from autotune.config import Config
    from autotune.placement import Placement
    from autotune.report import Reporter
    from autotune.select import Record
    from autotune.space import Space
    from autotune.tracking import Tracker

LOST_GRACE_S = 120.0
REMEASURE_BASE = 1_000_000


class Driver:
    """Runs one study. Holds the Optuna study, the Ray placement and the MLflow tracker."""

    def __init__(self, cfg: Config, space: Space, placement: Placement, tracker: Tracker | None,
                 reporter: Reporter) -> None:
        self.cfg = cfg
        self.space = space
        self.placement = placement
        self.tracker = tracker
        self.report = reporter
        self.pending: dict[Any, tuple] = {}
        self._unlogged: list[tuple] = []
        self.dir = Path(cfg.study.dir)
        self.quality = {"enabled": cfg.quality.enabled, "text": cfg.quality.text,
                        "n_tokens": cfg.quality.n_tokens, "reference_dir": None}

    # ---- specs ---------------------------------------------------------------------
    def spec(self, number: int, params: dict[str, Any], mode: str = "trial", quality: bool = True,
             tag: str = "trials") -> TrialSpec:
        return TrialSpec(
            number=number, engine=self.cfg.engine.kind, settings=self.cfg.engine.settings,
            variants=self.cfg.engine.variants, params=params, workload=asdict(self.cfg.workload),
            quality={**self.quality, "enabled": self.quality["enabled"] and quality},
            timeout_s=self.cfg.study.trial_timeout_s,
            workdir=str((self.dir / tag / f"{number:04d}").resolve()), mode=mode,
        )

    def resources(self, params: dict[str, Any]):
        return self.space.engine.resources(params, self.cfg.engine.settings)

    # ---- reference -------------------------------------------------------------------
    def ensure_reference(self) -> None:
        """Measure the quality reference once per study (cached by what defines it)."""
        if not self.cfg.quality.enabled:
            return
        base = self.space.engine.default_params(self.cfg.engine.settings, self.cfg.engine.variants)
        params = {**base, **self.cfg.quality.reference}
        model = params.get("model")
        key = json.dumps([params, self.cfg.engine.variants.get(model), self.cfg.quality.text,
                          self.cfg.quality.n_tokens], sort_keys=True, default=str)
        ref_dir = (self.dir / "reference" / hashlib.sha256(key.encode()).hexdigest()[:12]).resolve()
        self.quality["reference_dir"] = str(ref_dir)
        if reference_ready(ref_dir):
            self.report.note(f"quality reference cached: {ref_dir}")
            return
        self.report.note(f"measuring the quality reference {self.cfg.quality.reference} ...")
        spec = self.spec(0, params, mode="reference", tag="reference")
        result = self.placement.run_now(spec, self.resources(params))
        if not result.ok:
            raise RuntimeError(f"the quality reference failed: {result.reason}\n{result.log_tail}")
        self.report.note(f"reference perplexity {result.metrics['ppl']:.4f}")

    # ---- the loop ------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        t0 = time.monotonic()
        sampler = make_sampler(cfg.study.sampler, cfg.study.seed, self.space, cfg.study.n_trials)
        study, resumed = studylib.open_study(cfg, sampler)
        if not resumed:
            baseline = baseline_params(self.space, cfg.engine.variants)
            studylib.enqueue_initial(study, self.space, baseline, cfg.study.enqueue)
            study.set_user_attr("fingerprint", studylib.config_fingerprint(cfg))
        elif study.user_attrs.get("fingerprint") != studylib.config_fingerprint(cfg):
            self.report.warn("the config changed since this study started; results mix both configs")
        if self.tracker:
            study.set_user_attr(studylib.tracking_key(), self.tracker.start_study(
                cfg.study.name, study.user_attrs.get(studylib.tracking_key()), {"engine": cfg.engine.kind}))
            space_text = "\n".join(
                f"{p.name}: {p.kind} {p.values() if p.values() is not None else p.dist}"
                + (f" when {p.when.text}" if p.when else "") for p in self.space.params.values())
            self.tracker.log_config(yaml.safe_dump(cfg.raw, sort_keys=False), space_text)
        self.report.start(study, resumed, studylib.n_finished(study))
        interrupted = False
        try:
            self.ensure_reference()
            self._loop(study, t0)
        except KeyboardInterrupt:
            interrupted = True
            self.report.warn("interrupted: stopping trials in flight and exporting what is done")
            self._abort_pending(study)
        if self.tracker:
            self._flush_logs()
        summary = self.finish(study, interrupted, time.monotonic() - t0)
        return summary

    def _loop(self, study, t0: float) -> None:
        cfg = self.cfg
        self.pending: dict[Any, tuple] = {}
        self._unlogged: list[tuple] = []
        slots = cfg.ray.max_concurrent or self.placement.default_slots()
        finished = studylib.n_finished(study)
        exhausted = getattr(study.sampler, "is_exhausted", lambda _s: False)
        while True:
            over_time = cfg.study.timeout_s is not None and time.monotonic() - t0 > cfg.study.timeout_s
            while (not over_time and len(self.pending) < slots and not exhausted(study)
                   and finished + len(self.pending) < cfg.study.n_trials):
                finished += not self._ask_one(study)
            self._flush_logs()  # MLflow writes overlap with the trials just submitted
            if not self.pending:
                return
            ready = self.placement.wait(list(self.pending), cfg.ray.wait_timeout_s)
            if ready:  # tell everything already done before refilling
                ready += self.placement.wait_all_done([r for r in self.pending if r not in ready])
            for ref in ready:
                trial, params, _ = self.pending.pop(ref)
                self._finish_one(study, trial, params, self.placement.result(ref, trial.number))
                finished += 1
            now = time.monotonic()
            for ref, (trial, params, deadline) in list(self.pending.items()):
                if now > deadline:
                    self.placement.cancel(ref)
                    self.pending.pop(ref)
                    self._finish_one(study, trial, params, TrialResult(
                        trial.number, "failed", reason="lost: no result from its Ray worker in time"))
                    finished += 1

    def _ask_one(self, study) -> bool:
        """Ask for a trial and launch it; False if it was settled at once (rule, unschedulable)."""
        trial = study.ask()
        params = self.space.suggest(trial)
        reasons = self.space.violations(params)
        if reasons:
            result = TrialResult(trial.number, "infeasible", reason="rule: " + "; ".join(reasons))
            self._finish_one(study, trial, params, result, started=False)
            return False
        res = self.resources(params)
        never = self.placement.fits(res)
        if never:
            result = TrialResult(trial.number, "infeasible", reason=f"unschedulable: {never}")
            self._finish_one(study, trial, params, result, started=False)
            return False
        spec = self.spec(trial.number, params)
        ref = self.placement.submit(spec, res)
        deadline = time.monotonic() + self.cfg.study.trial_timeout_s + LOST_GRACE_S
        self.pending[ref] = (trial, params, deadline)
        self.report.started(trial.number, params)
        return True

    def _finish_one(self, study, trial, params, result: TrialResult, started: bool = True) -> Record:
        record = studylib.tell(study, trial, self.cfg, params, result)
        log = Path(self.spec(trial.number, params).workdir) / "trial.log" if started else None
        self.report.finished(record, result.duration_s)
        if self.tracker:
            self._unlogged.append((trial.number, params, result.replace(
                status=record.status, reason=record.reason), record.feasible, log))
        return record

    def _flush_logs(self) -> None:
        """Write the told trials to MLflow (after the free slots were refilled)."""
        while self._unlogged:
            self.tracker.log_trial(*self._unlogged.pop(0))

    def _abort_pending(self, study) -> None:
        from optuna.trial import TrialState

        for ref, (trial, _params, _) in list(getattr(self, "pending", {}).items()):
            self.placement.cancel(ref)
            trial.set_user_attr("status", "failed")
            trial.set_user_attr("reason", "interrupted")
            study.tell(trial, state=TrialState.FAIL)
        self.pending = {}

    # ---- end of study --------------------------------------------------------------
    def finish(self, study, interrupted: bool, elapsed: float) -> dict[str, Any]:
        from autotune import export
        from autotune.remeasure import choose_winner
        from autotune.select import pareto_front

        cfg = self.cfg
        recs = studylib.records(study)
        objectives = [o.metric for o in cfg.objectives]
        front = pareto_front(recs, objectives)
        baseline = next((r for r in recs if r.number == 0), None)
        verdict = {} if interrupted else choose_winner(self, front, baseline)
        winner = verdict.get("winner") or (front[0] if front else None)
        baseline = verdict.pop("baseline_remeasured", None) or baseline
        summary = {
            "study": cfg.study.name, "engine": cfg.engine.kind, "interrupted": interrupted,
            "n_trials": len(recs), "n_feasible": sum(r.feasible for r in recs),
            "n_failed": sum(r.status in ("failed", "timeout") for r in recs),
            "n_infeasible": sum(r.status == "infeasible" or (r.status == "ok" and not r.feasible) for r in recs),
            "elapsed_s": round(elapsed, 1), "objectives": objectives,
            "constraints": [str(c) for c in cfg.constraints],
            "workload": asdict(cfg.workload),
            "baseline": asdict(baseline) if baseline else None,
            "winner": asdict(winner) if winner else None,
            "pareto": [r.number for r in front],
            **{k: v for k, v in verdict.items() if k != "winner"},
        }
        if winner and baseline and "speedup" not in summary:
            b, w = baseline.metrics.get(cfg.select.metric), winner.metrics.get(cfg.select.metric)
            if b and w and math.isfinite(b) and math.isfinite(w):
                summary["speedup"] = w / b
                summary["speedup_source"] = "search"
        summary["winner_metrics"] = winner.metrics if winner else {}
        if winner:
            summary["warnings"] = self.space.engine.export_warnings(winner.params, cfg.engine.settings)
        files = export.write_all(self.dir, cfg, self.space, front, winner, summary)
        if self.tracker:
            self.tracker.finish(summary, files, "KILLED" if interrupted else "FINISHED")
        self.report.summary(summary, files)
        return summary
