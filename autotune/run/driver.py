"""The ask/tell loop: ask -> check -> place on Ray -> wait for one -> tell + log -> refill.

Up to N trials are in flight (``ray.max_concurrent`` or what the cluster holds); as soon as
one finishes it is told and the next is asked for, with no batch barrier. Every wait has a
timeout, so a lost worker costs one trial, never the study.

``study.n_trials`` counts launched configurations. A proposal that breaks a rule, that the
engine predicts will not fit (``study.precheck``) or that the cluster can never hold is
told infeasible without starting anything and the sampler is asked again; a proposal
equal to a measured configuration is told that configuration's result. Neither counts;
``study.max_rejected`` such proposals in a row end the study with a one-line reason.
A trial cut off by a stop is re-queued on resume and does not count either.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import yaml

from autotune.engines import spill
from autotune.engines.predict import Prediction
from autotune.errors import ConfigError
from autotune.measure.quality import reference_ready
from autotune.record import optuna_study as studylib
from autotune.record import storage
from autotune.record.resume import FORKED_ATTR
from autotune.record.resume import PARTS_ATTR
from autotune.record.resume import config_parts
from autotune.record.summary import StudySummary
from autotune.record.summary import Verdict
from autotune.record.tracking import PARENT_ATTR
from autotune.run import finish as finishing
from autotune.run import prune
from autotune.run import stop
from autotune.run.clock import Clock
from autotune.run.headroom import with_roofline
from autotune.run.launcher import Launcher
from autotune.run.quality_memo import QualityMemo
from autotune.search import context
from autotune.search import trials as trialslib
from autotune.search.design import FAST_PART
from autotune.search.design import NO_PRIOR_STARTUP
from autotune.search.design import config_key
from autotune.search.design import default_n_startup
from autotune.search.design import has_speed_prior
from autotune.search.design import startup_design
from autotune.search.pool import Pool
from autotune.search.pool import build_pool
from autotune.search.pool import uses_order
from autotune.search.samplers import make_sampler
from autotune.search.samplers import resolve
from autotune.search.samplers import uses_design
from autotune.search.space import baseline_params
from autotune.trial.spec import TrialResult

if TYPE_CHECKING:
    import optuna

    from autotune.config.schema import Config
    from autotune.output.report import Reporter
    from autotune.record.tracking import Tracker
    from autotune.run.placement import Placement
    from autotune.search.space import Space
    from autotune.search.trials import Record

LOST_GRACE_S = 120.0
REJECTED_PER_TRIAL = 20  # default study.max_rejected: this many x n_trials in a row


@dataclass(frozen=True)
class PendingTrial:
    """A launched trial in flight: its Optuna trial, parameters, deadline and identity."""

    trial: optuna.Trial
    params: dict[str, Any]
    deadline: float
    key: str
    reads: list = ()  # what a decoded token reads per device (Prediction.reads, as dicts)
    quality_from: int | None = None  # the trial whose quality numbers this one reuses


class Driver:
    """Runs one study. Holds the Optuna study, the launcher (Ray placement) and the tracker."""

    def __init__(self, cfg: Config, space: Space, placement: Placement, tracker: Tracker | None,
                 reporter: Reporter, seeds: list[dict[str, Any]] | None = None,
                 fork_of: str | None = None) -> None:
        self.cfg = cfg
        self.space = space
        self.placement = placement
        self.launcher = Launcher(cfg, space.engine, placement)
        self.tracker = tracker
        self.report = reporter
        self.pending: dict[Any, PendingTrial] = {}
        self.measured: dict[str, Record] = {}  # config key -> its launched, finished record
        self.stop_reason: str | None = None
        self._unlogged: list[tuple] = []
        self.dir = Path(cfg.study.dir)
        self.seeds = list(seeds or [])  # a fork's configurations, measured right after trial 0
        self.fork_of = fork_of  # the study a fork (autotune run --fork) was seeded from
        self.stopped: KeyboardInterrupt | None = None  # Ctrl-C, SIGTERM or SIGHUP (run.stop)
        self.stop_mark = stop.mark()  # the stop signals that came before this driver are not its own
        self.clock = Clock()  # the loop and its waits for trials: the rest is search overhead
        self.quality = QualityMemo(cfg, space.engine)  # quality measured once per quality key

    # ---- before the loop -------------------------------------------------------------
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
        self.launcher.set_reference(str(ref_dir))
        if reference_ready(ref_dir):
            self.report.note(f"quality reference cached: {ref_dir}")
            return
        self.report.note(f"measuring the quality reference {self.cfg.quality.reference} ...")
        result = self.launcher.run_now(0, params, mode="reference", tag="reference")
        if not result.ok:  # one line, exit 2; Driver.run ends the MLflow parent run FAILED
            log = self.launcher.workdir(0, "reference") / "trial.log"
            raise ConfigError("quality.reference", self.cfg.quality.reference,
                              f"the reference configuration failed ({result.status}: "
                              f"{' '.join(result.reason.split())[:300]}); log: {log}")
        self.report.note(f"reference perplexity {result.metrics['ppl']:.4f}")

    def predict(self, params: dict[str, Any]) -> Prediction:
        """The engine's pre-launch estimate for ``params`` (unknown when it has none)."""
        return self.space.engine.predict(params, self.cfg.engine.settings, self.cfg.engine.variants)

    def _screen(self, params: dict[str, Any]) -> tuple[bool, float | None]:
        pred = self.predict(params)
        return (not self.cfg.study.precheck or pred.fits is not False), pred.decode_tps_upper

    def pool(self) -> Pool:
        """The launchable configurations (rules, engine check, fit prediction) for ``bo``."""
        with self.report.slow_step("building the pool of launchable configurations (rules, "
                                   "engine check and fit prediction of each)"):
            return build_pool(self.space, self._screen, self.cfg.study.seed,
                              ordered=uses_order(self.cfg.study.search),
                              expect=lambda params: dict(self.predict(params).expect))

    @functools.cached_property
    def speed_prior(self) -> bool:
        """Whether the engine's decode-speed bounds rank configurations (``has_speed_prior``),
        screened once per driver."""
        return has_speed_prior(self.space, self.cfg.study.seed, self._screen)

    def n_startup(self) -> int:
        """Trials before the sampler's model (trial 0 and the design included): ``study.n_startup``,
        else by the budget, and for a single-objective ``bo`` search without a speed prior (no
        bound, or one that ranks nothing: ``has_speed_prior``) at most ``NO_PRIOR_STARTUP``
        (:mod:`autotune.search.design`)."""
        st = self.cfg.study
        if st.n_startup is not None:
            return st.n_startup
        n = default_n_startup(st.n_trials)
        if st.search == "single" and resolve(st.sampler, st.search, len(self.cfg.objectives)) == "bo" \
                and not self.speed_prior:
            n = min(n, NO_PRIOR_STARTUP)
        return n

    def design(self, baseline: dict[str, Any]) -> list[dict[str, Any]]:
        """The space-filling startup configurations after trial 0 and ``study.enqueue``; never
        more than the budget leaves (a covering design may ask for more than ``n_startup``)."""
        st = self.cfg.study
        if not uses_design(st.sampler):
            return []
        queued = [baseline] + [self.space.restrict({**baseline, **e}) for e in st.enqueue]
        sampler = resolve(st.sampler, st.search, len(self.cfg.objectives))
        design = startup_design(self.space, self.n_startup() - len(queued), st.seed, queued, self._screen,
                                FAST_PART[sampler], lazy=sampler == "bo" and st.search == "single")
        return design[: max(st.n_trials - len(queued) - len(self.seeds), 0)]

    # ---- the loop ------------------------------------------------------------------
    def run(self) -> StudySummary:
        cfg = self.cfg
        t0 = time.monotonic()
        stop.install()  # after ray.init (Placement), whose own SIGTERM handlers would pre-empt ours
        sampler = make_sampler(cfg.study.sampler, cfg.study.seed, self.space, cfg.study.n_trials,
                               self.n_startup(), cfg.study.search, pool=self.pool,
                               constraints=cfg.constraints, objectives=studylib.told_names(cfg))
        study, resumed = studylib.open_study(cfg, sampler)
        self.bind(study, studylib.with_baseline(cfg, studylib.study_attr(study, studylib.BASELINE_ATTR)))
        if not resumed:
            baseline = baseline_params(self.space, cfg.engine.variants)
            studylib.enqueue_initial(study, self.space, baseline, [*self.seeds, *cfg.study.enqueue],
                                     self.design(baseline))
            studylib.set_study_attr(study, studylib.FINGERPRINT, studylib.config_fingerprint(cfg))
        # what a measurement means, checked on the next resume (autotune.record.resume)
        studylib.set_study_attr(study, PARTS_ATTR, config_parts(cfg))
        if self.fork_of and not resumed:
            studylib.set_study_attr(study, FORKED_ATTR, self.fork_of)
        rerun = studylib.requeue_interrupted(study)
        if rerun:
            self.report.note(f"re-queued trial(s) {rerun}, cut off by a stop (not counted in n_trials)")
        if self.tracker:
            studylib.set_study_attr(study, PARENT_ATTR, self.tracker.start_study(
                cfg.study.name, studylib.study_attr(study, PARENT_ATTR), {"engine": cfg.engine.kind}))
            self.tracker.reconcile(study)
            space_text = "\n".join(
                f"{p.name}: {p.kind} {p.values() if p.values() is not None else p.dist}"
                + (f" when {p.when.text}" if p.when else "") for p in self.space.params.values())
            self.tracker.log_config(yaml.safe_dump(cfg.raw, sort_keys=False), space_text)
        self.report.start(study, resumed, studylib.n_launched(study))
        interrupted = False
        try:
            self.ensure_reference()
            with stop.deferred():  # a stop raises while the loop waits, never mid-write
                with self.clock.span("loop"):
                    self._loop(study, t0)
            stop.check(self.stop_mark)
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM / SIGHUP (autotune.run.stop.Stopped)
            interrupted, self.stopped = True, e
            self.report.warn(f"interrupted ({stop.name(e)}): stopping trials in flight and "
                             "exporting what is done")
            self._abort_pending(study)
        except Exception as e:  # the parent run never stays RUNNING (H5)
            if self.tracker:
                self._flush_logs()
                self.tracker.fail(" ".join(str(e).split()))
            raise
        if self.tracker:
            self._flush_logs()
            self.tracker.reconcile(study)  # in-flight duplicates, Ctrl-C leftovers: MLflow = Optuna
        return self.finish(study, interrupted, time.monotonic() - t0)

    def _loop(self, study: optuna.Study, t0: float) -> None:
        cfg = self.cfg
        slots = cfg.ray.max_concurrent or self.placement.default_slots()
        launched = studylib.n_launched(study)
        self.measured = {config_key(r.params): r for r in studylib.records(study)
                         if r.kind == trialslib.LAUNCHED}
        self.quality.recall(study)  # a resumed study's quality measurements
        cap = cfg.study.max_rejected or REJECTED_PER_TRIAL * cfg.study.n_trials
        refused = 0  # proposals in a row that could not be launched
        exhausted = getattr(study.sampler, "is_exhausted", lambda _s: False)
        while True:
            stop.check(self.stop_mark)  # a Ctrl-C whose KeyboardInterrupt a library swallowed
            over_time = cfg.study.timeout_s is not None and time.monotonic() - t0 > cfg.study.timeout_s
            # a relative bound not known yet: one trial at a time until one measured its metric
            room = 1 if studylib.unresolved(self.cfg) else slots
            while (not over_time and self.stop_reason is None and len(self.pending) < room
                   and not exhausted(study) and launched + len(self.pending) < cfg.study.n_trials):
                stop.check(self.stop_mark)  # between asks: a stop noted while deferred
                why = self._ask_one(study)
                refused = 0 if why is None else refused + 1
                if refused >= cap:
                    self.stop_reason = (
                        f"stopped: {refused} proposals in a row could not be launched "
                        f"(study.max_rejected={cap}); last: {why[:200]}. Relax the rules, change "
                        "the space or raise study.max_rejected")
                    self.report.warn(self.stop_reason)
            self._flush_logs()  # MLflow writes overlap with the trials just submitted
            if not self.pending:
                if exhausted(study) and self.stop_reason is None and launched < cfg.study.n_trials:
                    self.stop_reason = (f"stopped: every launchable configuration was measured "
                                        f"({launched} of study.n_trials={cfg.study.n_trials})")
                    self.report.note(self.stop_reason)
                return
            with self.clock.span("wait"):
                with stop.interruptible(self.stop_mark):
                    ready = self.placement.wait(list(self.pending), cfg.ray.wait_timeout_s)
                if ready:  # tell everything already done before refilling
                    ready += self.placement.wait_all_done([r for r in self.pending if r not in ready])
            for ref in ready:
                p = self.pending.pop(ref)
                self._finish_one(study, p, self.placement.result(ref, p.trial.number))
                launched += 1
            now = time.monotonic()
            for ref, p in list(self.pending.items()):
                if now > p.deadline:
                    self.placement.cancel(ref)
                    self.pending.pop(ref)
                    self._finish_one(study, p, TrialResult(
                        p.trial.number, "failed", reason="lost: no result from its Ray worker in time"))
                    launched += 1

    def _ask_one(self, study: optuna.Study) -> str | None:
        """Ask for a trial and launch it (None), or settle it at once and say why not."""
        with self.report.slow_step("the sampler is choosing the next configuration"):
            trial = study.ask()
        params = self.space.suggest(trial)
        reasons = self.space.violations(params)
        if reasons:
            return self._refuse(study, trial, params, "rule: " + "; ".join(reasons))
        if trialslib.trial_attrs(trial).role == "design" and context.MOVE_DESIGN:
            short = self._short_context(study, trial, params)
            if short:
                return short
        pred = self.predict(params)
        if self.cfg.study.precheck and pred.fits is False:
            return self._refuse(study, trial, params, pred.reason or "predicted not to fit")
        never = self.launcher.unschedulable(params)
        if never:
            return self._refuse(study, trial, params, f"unschedulable: {never}")
        key = config_key(params)
        if key in self.measured or key in {p.key for p in self.pending.values()}:
            return self._duplicate(study, trial, params, key)
        broken = self.quality.breaks(params)  # its quality is known and breaks a bound
        if broken:
            return self._refuse(study, trial, params, broken)
        reads = [r.to_dict() for r in pred.reads]
        studylib.mark_launched(trial, params, pred.stored())
        reuse = self.quality.reusable(params)
        rule = prune.stop_rule(self.cfg, trial, self.measured.values())  # never for trial 0
        ref = self.launcher.submit(trial.number, params, quality=reuse is None, early_stop=rule)
        deadline = time.monotonic() + self.cfg.study.trial_timeout_s + LOST_GRACE_S
        self.pending[ref] = PendingTrial(trial, params, deadline, key, reads, reuse and reuse[0])
        self.report.started(trial.number, params)
        if reuse:
            self.report.note(f"  #{trial.number} reuses the quality measured by trial {reuse[0]} "
                             f"(same {', '.join(self.quality.knobs or ())})")
        return None

    def _short_context(self, study: optuna.Study, trial: optuna.Trial, params: dict[str, Any]) -> str | None:
        """A queued design point whose context a finished trial's overflow rules out
        (:mod:`autotune.search.context`; the design was drawn before trial 0 ran): refused, not
        counted, and queued again with each such context knob raised to the smallest value that
        holds what the workload needed, so the design still shows the point's other knobs."""
        failed = [r for r in self.measured.values() if r.status not in ("ok", "stopped")]
        need = context.limits([(r.params, r.reason) for r in failed])
        if context.allowed(params, need):
            return None
        raised, moves = dict(params), []
        for knob, n in need.items():
            value = params.get(knob)
            if context.allowed({knob: value}, {knob: n}):
                continue
            bigger = [v for v in self.space.params[knob].values() or []
                      if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= n]
            if not bigger:
                raised = None
                break
            raised[knob] = min(bigger)
            moves.append(f"{knob}={value} holds less than the {n} tokens a finished trial needed")
        if raised is None or self.space.violations(raised) or config_key(raised) in self.measured:
            return self._refuse(study, trial, params, "design point dropped: its context is too small "
                                "(context rule) and no larger value gives a new valid configuration")
        studylib.enqueue_design(study, raised)
        return self._refuse(study, trial, params, "design point moved: " + "; ".join(moves) + " (context "
                            "rule); queued again with " + ", ".join(f"{k}={raised[k]}" for k in need if k in raised))

    def _refuse(self, study: optuna.Study, trial: optuna.Trial, params: dict[str, Any], reason: str) -> str:
        """Tell a proposal that was never started as infeasible (the sampler learns; not counted)."""
        result = TrialResult(trial.number, "infeasible", reason=reason)
        record = studylib.tell(study, trial, self.cfg, params, result, kind=trialslib.REJECTED)
        self.report.finished(record, 0.0)
        self._log(record, result, None)
        return reason

    def _duplicate(self, study: optuna.Study, trial: optuna.Trial, params: dict[str, Any], key: str) -> str:
        """A configuration already measured (or in flight) is not launched again."""
        done = self.measured.get(key)
        if done is None:  # in flight: its result is not known yet; FAIL (samplers skip it)
            number = next(p.trial.number for p in self.pending.values() if p.key == key)
            reason = f"same configuration as trial {number} (in flight): not launched"
            studylib.tell_fail(study, trial, params, trialslib.DUPLICATE, reason)
            self.report.note(f"  #{trial.number} {reason}")
            return reason
        reason = f"same configuration as trial {done.number}: its result reused, not launched"
        result = TrialResult(trial.number, done.status, dict(done.metrics), reason=reason)
        record = studylib.tell(study, trial, self.cfg, params, result, kind=trialslib.DUPLICATE,
                               attrs={"duplicate_of": done.number})
        self.report.note(f"  #{trial.number} {reason}")
        self._log(record, result, None)
        return reason

    def _finish_one(self, study: optuna.Study, p: PendingTrial, result: TrialResult) -> Record:
        if result.status == "ok":  # a spill into system memory is no fit (engines/spill.py)
            upper = self.predict(p.params).decode_tps_upper
            result = spill.judge(result, self.cfg.engine.settings, upper)
        result = with_roofline(result, p.reads, self.cfg.workload)
        if result.status == "ok":
            self.note_baseline(study, p.trial.number, result.metrics)
        result, attrs = self.quality.settle(p.trial.number, p.params, result, p.quality_from,
                                            self.launcher.workdir(p.trial.number) / "result.json")
        record = studylib.tell(study, p.trial, self.cfg, p.params, result, attrs=attrs)
        storage.backup(self.cfg.storage_url)  # optuna.db.bak: a damaged file costs this trial at most
        self.measured[p.key] = record
        self.report.finished(record, result.duration_s)
        self._log(record, result, self.launcher.workdir(p.trial.number) / "trial.log")
        return record

    def bind(self, study: optuna.Study, cfg: Config) -> None:
        """Use ``cfg`` (the same study with relative bounds set) from now on, in the sampler too."""
        self.cfg = self.quality.cfg = cfg
        if hasattr(study.sampler, "constraints"):  # bo models the constraints itself
            study.sampler.constraints = list(cfg.constraints)

    def note_baseline(self, study: optuna.Study, number: int, metrics: dict[str, Any]) -> None:
        """Set the relative bounds (``ttft_p95_ms <= 1.5x baseline``) from the first trial that
        measured their metric: trial 0, the engine's defaults, unless it failed. Kept in the
        study, so a resumed run judges by the same bounds."""
        values = {m: [float(metrics[m]), number] for m in studylib.unresolved(self.cfg)
                  if isinstance(metrics.get(m), (int, float)) and math.isfinite(metrics[m])}
        if not values:
            return
        self.bind(study, studylib.with_baseline(self.cfg, values))
        studylib.set_study_attr(study, studylib.BASELINE_ATTR,
                                {**(studylib.study_attr(study, studylib.BASELINE_ATTR) or {}), **values})
        set_now = [c.describe() for c in self.cfg.constraints if c.factor is not None and c.metric in values]
        self.report.note(f"bounds relative to trial #{number}'s measurement: {', '.join(set_now)}")

    def _log(self, record: Record, result: TrialResult, log: Path | None) -> None:
        if self.tracker:
            self._unlogged.append((record.number, record.params, result.replace(
                status=record.status, reason=record.reason), record.feasible, log))

    def _flush_logs(self) -> None:
        """Write the told trials to MLflow (after the free slots were refilled)."""
        while self._unlogged:
            self.tracker.log_trial(*self._unlogged.pop(0))

    def _abort_pending(self, study: optuna.Study) -> None:
        self.placement.stop_all(list(self.pending))
        for p in self.pending.values():
            studylib.tell_fail(study, p.trial, p.params, trialslib.INTERRUPTED, "interrupted")
        self.pending = {}

    # ---- end of study: autotune.run.finish --------------------------------------------
    def choose_winner(self, recs: list[Record]) -> Verdict:
        """The winner among the candidates, re-measured side by side with the baseline (what
        :meth:`finish` does, for a caller without the rest of it: bench/surfaces/fast.py)."""
        return finishing.remeasure(self.cfg, self.launcher, self.report, recs)

    def finish(self, study: optuna.Study, interrupted: bool, elapsed: float) -> StudySummary:
        """Re-measure, summarise, export, tell MLflow and print (:func:`autotune.run.finish.finish`)."""
        summary, self.stopped = finishing.finish(self, study, interrupted, elapsed)
        return summary
