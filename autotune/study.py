"""The Optuna study of a config: open or resume it, tell results, read records back.

Infeasible, failed and timed-out trials are told as COMPLETE with the worst objective
values seen so far and a positive ``run_ok`` constraint, so every sampler learns to avoid
the region (Optuna's samplers ignore FAIL trials). Metrics, status and reason live in the
trial's user attributes.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.select import Record

if TYPE_CHECKING:
    from autotune.config import Config
    from autotune.space import Space
    from autotune.trial.spec import TrialResult

RUN_OK = "run_ok"
FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)


def config_fingerprint(cfg: Config) -> str:
    """Hash of what defines the search (engine, space, rules, objectives, workload)."""
    key = {k: cfg.raw.get(k) for k in ("engine", "space", "rules", "objectives", "constraints", "workload")}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def open_study(cfg: Config, sampler: optuna.samplers.BaseSampler) -> tuple[optuna.Study, bool]:
    """Create or load the study in persistent storage; returns (study, resumed)."""
    Path(cfg.study.dir).mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(cfg.storage_url, engine_kwargs={"connect_args": {"timeout": 30}}) \
        if cfg.storage_url.startswith("sqlite") else cfg.storage_url
    directions = [o.direction for o in cfg.objectives]
    study = optuna.create_study(
        storage=storage, study_name=cfg.study.name, directions=directions, sampler=sampler, load_if_exists=True
    )
    resumed = bool(study.trials)
    if study.directions and [d.name.lower() for d in study.directions] != directions:
        from autotune.errors import ConfigError

        raise ConfigError("objectives", [o.metric for o in cfg.objectives],
                          f"study {cfg.study.name} exists with other directions; change study.name")
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study._storage.set_trial_user_attr(t._trial_id, "status", "failed")
        study._storage.set_trial_user_attr(t._trial_id, "reason", "interrupted (driver stopped)")
        study.tell(t.number, state=TrialState.FAIL)
    return study, resumed


def n_finished(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=FINISHED))


def _worst(study: optuna.Study, cfg: Config) -> list[float] | None:
    """Per objective, the worst value among successful trials (None if there are none)."""
    from objectives import get_metric

    ok = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
          if t.user_attrs.get("status") == "ok"]
    if not ok:
        return None
    out = []
    for i, o in enumerate(cfg.objectives):
        m = get_metric(o.metric)
        vals = [t.values[i] for t in ok]
        out.append(min(vals) if m.higher_is_better else max(vals))
    return out


def constraint_values(cfg: Config, metrics: dict[str, float]) -> dict[str, float]:
    """Relative violation per constraint (<= 0 feasible); a missing metric counts as violated."""
    out = {}
    for c in cfg.constraints:
        v = metrics.get(c.metric)
        if v is None or not math.isfinite(v):
            out[str(c)] = 1.0
        else:
            out[str(c)] = c.violation(v) / max(abs(c.bound), 1e-9)
    return out


def tell(study: optuna.Study, trial: optuna.Trial, cfg: Config, params: dict, result: TrialResult) -> Record:
    """Record a result in the study (see the module docstring) and return its Record."""
    metrics = {k: float(v) for k, v in result.metrics.items()
               if isinstance(v, (int, float)) and math.isfinite(v)}
    values = [metrics.get(o.metric) for o in cfg.objectives]
    status, reason = result.status, result.reason
    if status == "ok" and any(v is None for v in values):
        missing = [o.metric for o, v in zip(cfg.objectives, values) if v is None]
        status, reason = "failed", f"objective metric(s) missing or not finite: {', '.join(missing)}"
    cons = constraint_values(cfg, metrics) if status == "ok" else {str(c): 1.0 for c in cfg.constraints}
    cons[RUN_OK] = 0.0 if status == "ok" else 1.0
    for name, value in cons.items():
        trial.set_constraint(name, value)
    attrs = {"status": status, "reason": reason, "metrics": metrics, "params": params,
             "node": result.node, "duration_s": result.duration_s}
    for k, v in attrs.items():
        trial.set_user_attr(k, v)
    if status == "ok":
        study.tell(trial, values)
    else:
        worst = _worst(study, cfg)
        if worst is None:
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, worst)
    feasible = status == "ok" and all(v <= 0 for v in cons.values())
    return Record(trial.number, params, metrics, status, feasible, reason, cons)


def records(study: optuna.Study) -> list[Record]:
    """Every finished trial as a Record (feasibility from its stored constraints)."""
    out = []
    for t in study.get_trials(deepcopy=False, states=FINISHED):
        cons = dict(t.constraints or {}) if hasattr(t, "constraints") else {}
        status = t.user_attrs.get("status", "failed" if t.state != TrialState.COMPLETE else "ok")
        feasible = t.state == TrialState.COMPLETE and status == "ok" and all(v <= 0 for v in cons.values())
        out.append(Record(t.number, t.user_attrs.get("params", dict(t.params)),
                          t.user_attrs.get("metrics", {}), status, feasible,
                          t.user_attrs.get("reason", ""), cons))
    return out


def enqueue_initial(study: optuna.Study, space: Space, baseline: dict[str, Any], extra: list[dict]) -> None:
    """Enqueue the baseline (trial 0) and the user's configs into a fresh study."""
    from autotune.space import encode

    study.enqueue_trial({k: encode(v) for k, v in baseline.items()}, user_attrs={"role": "baseline"})
    for cfg_params in extra:
        full = space.restrict({**baseline, **cfg_params})
        study.enqueue_trial({k: encode(v) for k, v in full.items()}, user_attrs={"role": "enqueued"})


def tracking_key() -> str:
    """User attribute of the study holding the MLflow parent run id (resume uses it)."""
    from autotune.tracking import PARENT_ATTR

    return PARENT_ATTR
