"""The Optuna study of a config: open or resume it, tell results, read records back.

What the sampler optimises depends on ``study.search``: ``single`` (default) tells one
value, the scalar the winner is chosen by (:func:`autotune.search.select.search_scalar`);
``pareto`` tells every objective. Records keep every measured metric either way, so the
exported Pareto front never depends on what the sampler was told.

A trial stopped early (``study.early_stop``, status ``stopped``) is told PRUNED, valued at its
partial numbers (single search: the told value reported as its last intermediate value, which
Optuna makes the PRUNED trial's value) with the constraints its partial numbers break; it
counts against ``n_trials`` and is never feasible, so never a winner or a re-measured candidate.
Infeasible, failed and timed-out trials are told as COMPLETE with the worst values seen so
far and a positive ``run_ok`` constraint, so every sampler learns to avoid the region
(Optuna's samplers ignore FAIL trials). Metrics, status, reason and the trial's ``kind``
live in its user attributes: ``launched`` (ran; counts against ``n_trials``), ``rejected``
(broke a rule or was predicted not to fit: never started), ``duplicate`` (same parameters
as a measured trial: its result reused) and ``interrupted`` (cut off by a stop: re-run on
resume, not counted).

Optuna's user attributes are written here only and read by
:func:`autotune.search.trials.trial_attrs` (a :class:`~autotune.search.trials.TrialAttrs`, which
the sampler reads too); :func:`tell`, :func:`tell_fail`, :func:`mark_launched`
and :func:`mark_interrupted` write them; :func:`study_attr` / :func:`set_study_attr` hold
the study's own (the config fingerprint, the MLflow parent run).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.errors import ConfigError
from autotune.record.storage import open_rdb
from autotune.search.select import search_direction
from autotune.search.select import search_scalar
from autotune.search.space import encode
from autotune.search.trials import INTERRUPTED
from autotune.search.trials import LAUNCHED
from autotune.search.trials import REJECTED
from autotune.search.trials import Record
from autotune.search.trials import trial_attrs

if TYPE_CHECKING:
    from autotune.config.schema import Config
    from autotune.search.space import Space
    from autotune.trial.spec import TrialResult

RUN_OK = "run_ok"
STOPPED = "stopped"  # a trial stopped early (study.early_stop): told PRUNED with its partial numbers
FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
FINGERPRINT = "fingerprint"  # study attribute: config_fingerprint of the config that started it
BASELINE_ATTR = "relative_baseline"  # study attribute: {metric: [value, trial]} relative bounds use


# ---- user attributes: the one place that writes them (read by search.trials.trial_attrs) ----
def copied_attrs(t: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """Every user attribute of ``t``, to copy the trial into another (in-memory) study."""
    return dict(t.user_attrs)


def _set_attrs(trial: optuna.Trial, attrs: dict[str, Any]) -> None:
    for key, value in attrs.items():
        trial.set_user_attr(key, value)


def mark_launched(trial: optuna.Trial, params: dict[str, Any], prediction: dict[str, Any] | None) -> None:
    """Attributes of a trial about to start: its kind, parameters and the engine's prediction."""
    _set_attrs(trial, {"kind": LAUNCHED, "params": params})
    if prediction is not None:
        _set_attrs(trial, {"prediction": prediction})


def study_attr(study: optuna.Study, name: str) -> Any:
    """One of the study's own attributes (``FINGERPRINT``, the MLflow parent run id); None if unset."""
    return study.user_attrs.get(name)


def set_study_attr(study: optuna.Study, name: str, value: Any) -> None:
    """Set one of the study's own attributes (a JSON-serialisable value)."""
    study.set_user_attr(name, value)


def config_fingerprint(cfg: Config) -> str:
    """Hash of what defines the search (engine, space, rules, objectives, workload)."""
    key = {k: cfg.raw.get(k) for k in ("engine", "space", "rules", "objectives", "constraints", "workload")}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def directions(cfg: Config) -> list[str]:
    """Study directions: the selection scalar's (single) or every objective's (pareto)."""
    if cfg.study.search == "pareto":
        return [o.direction for o in cfg.objectives]
    return [search_direction(cfg.select.rule, cfg.select.metric)]


def told_names(cfg: Config) -> list[str]:
    """What :func:`told_values` holds, in order: the objectives' metrics (pareto), else the
    selection metric, or the rule (``knee``, ``weighted``) whose scalar is told."""
    if cfg.study.search == "pareto":
        return [o.metric for o in cfg.objectives]
    return [cfg.select.metric if cfg.select.rule == "max" else cfg.select.rule]


def told_values(cfg: Config, metrics: dict[str, float]) -> tuple[list[float] | None, str]:
    """The values told to the sampler for measured ``metrics``; (None, why) if one is missing."""
    if cfg.study.search == "pareto":
        missing = [o.metric for o in cfg.objectives if o.metric not in metrics]
        values = [metrics.get(o.metric) for o in cfg.objectives]
    else:
        sel = cfg.select
        objectives = [o.metric for o in cfg.objectives]
        value = search_scalar(metrics, sel.rule, sel.metric, objectives, sel.weights)
        reads = [sel.metric] if sel.rule == "max" else list(sel.weights if sel.rule == "weighted" else objectives)
        missing = [m for m in reads if m not in metrics] if value is None else []
        values = [value]
    if missing:
        return None, f"objective metric(s) missing or not finite: {', '.join(missing)}"
    return values, ""


def open_study(cfg: Config, sampler: optuna.samplers.BaseSampler) -> tuple[optuna.Study, bool]:
    """Create or load the study in persistent storage; returns (study, resumed).

    Trials left RUNNING by a killed driver are marked ``interrupted`` (FAIL); see
    :func:`requeue_interrupted`.
    """
    Path(cfg.study.dir).mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_rdb(cfg.storage_url)  # SQLite in WAL mode (autotune.record.storage)
    dirs = directions(cfg)
    study = optuna.create_study(
        storage=storage, study_name=cfg.study.name, directions=dirs, sampler=sampler, load_if_exists=True
    )
    resumed = bool(study.trials)
    if study.directions and [d.name.lower() for d in study.directions] != dirs:
        raise ConfigError("study.search", cfg.study.search,
                          f"study {cfg.study.name} exists with other objectives or search mode; "
                          "change study.name")
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        mark_interrupted(study, t._trial_id, "interrupted (driver stopped)")
        study.tell(t.number, state=TrialState.FAIL)
    return study, resumed


def mark_interrupted(study: optuna.Study, trial_id: int, reason: str) -> None:
    """Attributes of a trial cut off by a stop (call before telling it FAIL)."""
    for key, value in (("status", "failed"), ("reason", reason), ("kind", INTERRUPTED)):
        study._storage.set_trial_user_attr(trial_id, key, value)


def tell_fail(study: optuna.Study, trial: optuna.Trial, params: dict, kind: str, reason: str) -> None:
    """Tell a trial FAIL (samplers skip it): an in-flight duplicate, or cut off by a stop."""
    _set_attrs(trial, {"status": "failed", "reason": reason, "kind": kind, "params": params})
    study.tell(trial, state=TrialState.FAIL)


def kind_of(t: optuna.trial.FrozenTrial) -> str:
    """A finished trial's kind (studies from before kinds: rule refusals were never run)."""
    a = trial_attrs(t)
    if a.kind:
        return a.kind
    if a.status == "infeasible" and a.reason.startswith("rule"):
        return REJECTED
    return LAUNCHED


def n_launched(study: optuna.Study) -> int:
    """Finished trials that ran a configuration: what ``study.n_trials`` counts."""
    return sum(kind_of(t) == LAUNCHED for t in study.get_trials(deepcopy=False, states=FINISHED))


def n_finished(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=FINISHED))


def _worst(study: optuna.Study) -> list[float] | None:
    """Per told value, the worst among successful trials (None if there are none)."""
    ok = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
          if trial_attrs(t).status == "ok"]
    if not ok:
        return None
    out = []
    for i, d in enumerate(study.directions):
        vals = [t.values[i] for t in ok]
        out.append(min(vals) if d == optuna.study.StudyDirection.MAXIMIZE else max(vals))
    return out


def unresolved(cfg: Config) -> list[str]:
    """The metrics of relative constraints (``ttft_p95_ms <= 1.5x baseline``) whose bound is not
    known yet: nothing measured them so far."""
    return sorted({c.metric for c in cfg.constraints if not c.known})


def with_baseline(cfg: Config, baseline: dict[str, list] | None) -> Config:
    """``cfg`` with its relative constraints' bounds set from the baseline's measured values
    (``{metric: [value, trial]}``, the study's ``BASELINE_ATTR``)."""
    if not baseline or not unresolved(cfg):
        return cfg
    return dataclasses.replace(cfg, constraints=[
        c.resolved(float(baseline[c.metric][0])) if not c.known and c.metric in baseline else c
        for c in cfg.constraints])


def constraint_values(cfg: Config, metrics: dict[str, float]) -> dict[str, float]:
    """Relative violation per constraint (<= 0 feasible); a missing metric counts as violated,
    a relative bound not known yet judges nothing (0; the driver sets it before any trial is
    told ok: :meth:`autotune.run.driver.Driver.note_baseline`)."""
    out = {}
    for c in cfg.constraints:
        v = metrics.get(c.metric)
        if v is None or not math.isfinite(v):
            out[str(c)] = 1.0
        elif not c.known:
            out[str(c)] = 0.0
        else:
            out[str(c)] = c.violation(v) / max(abs(c.bound), 1e-9)
    return out


def tell(study: optuna.Study, trial: optuna.Trial, cfg: Config, params: dict, result: TrialResult,
         kind: str = LAUNCHED, attrs: dict[str, Any] | None = None) -> Record:
    """Record a result in the study (see the module docstring) and return its Record."""
    metrics = {k: float(v) for k, v in result.metrics.items()
               if isinstance(v, (int, float)) and math.isfinite(v)}
    values, missing = told_values(cfg, metrics)
    status, reason = result.status, result.reason
    if status == "ok" and values is None:
        status, reason = "failed", missing
    if status == STOPPED:  # its partial numbers: a bound it did not measure is not judged (0)
        cons = {k: v if cfg.constraints[i].metric in metrics else 0.0
                for i, (k, v) in enumerate(constraint_values(cfg, metrics).items())}
    else:
        cons = constraint_values(cfg, metrics) if status == "ok" else {str(c): 1.0 for c in cfg.constraints}
    cons[RUN_OK] = 0.0 if status in ("ok", STOPPED) else 1.0
    for name, value in cons.items():
        trial.set_constraint(name, value)
    stored = {"status": status, "reason": reason, "metrics": metrics, "params": params,
              "node": result.node, "duration_s": result.duration_s, "kind": kind,
              **({"times_s": result.times_s} if result.times_s else {}), **(attrs or {})}
    _set_attrs(trial, stored)
    if status == "ok":
        study.tell(trial, values)
    elif status == STOPPED:  # PRUNED, valued at its partial numbers (Optuna takes the last report)
        if values is not None and len(study.directions) == 1:
            trial.report(values[0], step=1)
        study.tell(trial, state=TrialState.PRUNED)
    else:
        worst = _worst(study)
        if worst is None:
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, worst)
    feasible = status == "ok" and all(v <= 0 for v in cons.values())
    return Record(trial.number, params, metrics, status, feasible, reason, cons, kind)


def records(study: optuna.Study) -> list[Record]:
    """Every finished trial as a Record (feasibility from its stored constraints)."""
    out = []
    for t in study.get_trials(deepcopy=False, states=FINISHED):
        cons = dict(t.constraints or {}) if hasattr(t, "constraints") else {}
        a = trial_attrs(t)
        status = a.status if a.status is not None else ("failed" if t.state != TrialState.COMPLETE else "ok")
        feasible = t.state == TrialState.COMPLETE and status == "ok" and all(v <= 0 for v in cons.values())
        params = a.params if a.params is not None else dict(t.params)
        out.append(Record(t.number, params, a.metrics, status, feasible, a.reason, cons, kind_of(t)))
    return out


def enqueue_initial(study: optuna.Study, space: Space, baseline: dict[str, Any], extra: list[dict],
                    design: list[dict] = ()) -> None:
    """Enqueue the baseline (trial 0), the user's configs and the startup design, in that order."""
    study.enqueue_trial({k: encode(v) for k, v in baseline.items()}, user_attrs={"role": "baseline"})
    for cfg_params in extra:
        full = space.restrict({**baseline, **cfg_params})
        study.enqueue_trial({k: encode(v) for k, v in full.items()}, user_attrs={"role": "enqueued"})
    for params in design:
        enqueue_design(study, params)


def enqueue_design(study: optuna.Study, params: dict[str, Any]) -> None:
    """Queue one startup-design configuration (after whatever is queued)."""
    study.enqueue_trial({k: encode(v) for k, v in params.items()}, user_attrs={"role": "design"})


def requeue_interrupted(study: optuna.Study) -> list[int]:
    """Enqueue again every interrupted trial's configuration not yet re-queued; their numbers."""
    trials = study.get_trials(deepcopy=False)
    done = {trial_attrs(t).rerun_of for t in trials}
    out = []
    for t in trials:
        # an enqueued trial killed before suggest() has its configuration only in fixed_params
        params = dict(t.params) or dict(t.system_attrs.get("fixed_params") or {})
        if t.state == TrialState.FAIL and kind_of(t) == INTERRUPTED and t.number not in done and params:
            study.enqueue_trial(params, user_attrs={"role": "rerun", "rerun_of": t.number})
            out.append(t.number)
    return out

