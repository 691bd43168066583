"""MLflow tracking: one parent run per study, one nested run per trial.

Uses ``MlflowClient`` with explicit run ids (no fluent global state). The store is a
SQLite database under ``mlruns/`` (MLflow 3 refuses the old file store); artifacts go to
``mlruns/artifacts``. Open it with ``mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db``.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from optuna.trial import TrialState

from autotune.record import mlflow_view
from autotune.search.trials import trial_attrs
from autotune.trial.spec import TrialResult

if TYPE_CHECKING:
    from autotune.config.schema import Config
    from autotune.record.summary import StudySummary

PARENT_ATTR = mlflow_view.PARENT_ATTR


def _create_whole(uri: str) -> None:
    """A new SQLite store is made under another name and linked into place once MLflow's
    migrations have run (a few seconds on a fresh box): a driver killed meanwhile leaves no
    half-migrated ``mlflow.db``, which MLflow cannot open again ("duplicate column name: step",
    found by SIGKILLing drivers at random moments). Two studies creating the same store at once
    both succeed: the first link wins, the other's copy is dropped."""
    if not uri.startswith("sqlite:///"):
        return
    from mlflow.tracking import MlflowClient

    path = Path(uri[len("sqlite:///"):])
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        return
    for old in path.parent.glob(f"{path.name}.new-*"):  # left by a creation that was killed
        pid = old.name.rpartition("-")[2]
        if not (pid.isdigit() and Path(f"/proc/{pid}").exists()):
            old.unlink(missing_ok=True)
    tmp = path.with_name(f"{path.name}.new-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments(max_results=1)  # migrates
    with contextlib.suppress(FileExistsError):
        os.link(tmp, path)
    tmp.unlink()


def _params(params: dict[str, Any]) -> dict[str, str]:
    return {k: str(v)[:6000] for k, v in params.items()}


class Tracker:
    """Logs a study to MLflow. Not thread-safe: call it from the driver thread only."""

    def __init__(self, cfg: Config) -> None:
        from autotune.record.mlflow_view import quiet

        quiet()  # no MLflow / alembic database set-up lines on the console
        from mlflow.tracking import MlflowClient

        _create_whole(cfg.tracking.uri)
        self.client = MlflowClient(tracking_uri=cfg.tracking.uri)
        name = cfg.tracking.experiment or cfg.study.name
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            artifacts = Path(cfg.tracking.artifacts).resolve()
            artifacts.mkdir(parents=True, exist_ok=True)
            self.experiment_id = self.client.create_experiment(name, artifact_location=artifacts.as_uri())
        else:
            self.experiment_id = exp.experiment_id
        from autotune.record.mlflow_view import describe_experiment
        from autotune.record.mlflow_view import varying_params

        describe_experiment(self.client, self.experiment_id, [o.metric for o in cfg.objectives]
                            + [c.metric for c in cfg.constraints])
        self.varying = varying_params(cfg.space)
        self.parent_id: str | None = None
        self.study_dir = Path(cfg.study.dir)

    def start_study(self, study_name: str, existing_parent: str | None, tags: dict[str, str]) -> str:
        """Create (or resume) the parent run; returns its id."""
        if existing_parent:
            try:
                self.client.get_run(existing_parent)
                self.parent_id = existing_parent
                self.client.update_run(existing_parent, status="RUNNING")
                return existing_parent
            except Exception:  # noqa: BLE001 - the store was wiped: start a new parent
                pass
        run = self.client.create_run(
            self.experiment_id, run_name=study_name, tags={"autotune.study": study_name, **tags}
        )
        self.parent_id = run.info.run_id
        return self.parent_id

    def log_config(self, config_yaml: str, space_text: str) -> None:
        self.client.log_text(self.parent_id, config_yaml, "config.yaml")
        self.client.log_text(self.parent_id, space_text, "space.txt")

    def log_trial(self, number: int, params: dict, result: TrialResult, feasible: bool, log_path: Path | None) -> str:
        """One nested run with params, finite metrics, status tags and the trial log."""
        from mlflow.entities import Metric
        from mlflow.entities import Param
        from mlflow.entities import RunTag

        run = self.client.create_run(
            self.experiment_id, run_name=mlflow_view.run_name(number, params, getattr(self, "varying", [])),
            tags={"mlflow.parentRunId": self.parent_id, "autotune.trial": str(number)},
        )
        rid = run.info.run_id
        now = int(time.time() * 1000)
        durations = {"duration_s": result.duration_s,
                     **{f"duration_{k}_s": v for k, v in result.times_s.items()}}
        metrics = [Metric(k, float(v), now, 0) for k, v in {**result.metrics, **durations}.items()
                   if isinstance(v, (int, float)) and math.isfinite(v)]
        tags = {"status": result.status, "feasible": str(feasible), "reason": result.reason[:5000],
                "node": result.node, "duration_s": f"{result.duration_s:.2f}"}
        self.client.log_batch(
            rid, metrics=metrics, params=[Param(k, v) for k, v in _params(params).items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        if log_path is not None and log_path.exists():
            self.client.log_artifact(rid, str(log_path))
        # a trial stopped early ended as planned: FINISHED, its tags say "stopped early: <reason>"
        self.client.set_terminated(rid, "FINISHED" if result.status in ("ok", "stopped") else "FAILED")
        return rid

    def fail(self, reason: str) -> None:
        """End the parent run FAILED with the reason (the study stopped on an error)."""
        if self.parent_id is None:
            return
        self.client.set_tag(self.parent_id, "autotune.error", reason[:5000])
        self.client.set_terminated(self.parent_id, "FAILED")

    # ---- reconciliation: Optuna's storage is the truth ------------------------------
    def trial_runs(self) -> dict[int, list[Any]]:
        """The parent's child runs (not deleted), by trial number."""
        out: dict[int, list[Any]] = {}
        token = None
        while True:
            page = self.client.search_runs(
                [self.experiment_id], f"tags.`mlflow.parentRunId` = '{self.parent_id}'",
                max_results=1000, page_token=token)
            for run in page:
                number = run.data.tags.get("autotune.trial")
                if number is not None and number.isdigit():
                    out.setdefault(int(number), []).append(run)
            token = page.token
            if not token:
                return out

    def reconcile(self, study: Any) -> int:
        """Log every finished Optuna trial that has no complete MLflow run; returns how many.

        Called on every start and resume (after :meth:`start_study`). A trial told to Optuna
        but killed before it was logged gets its run now (status, params, metrics, reason
        and log from the trial's user attributes and ``<study.dir>/trials/NNNN/``); a run
        left RUNNING by a kill mid-logging, or a duplicate, is deleted and logged again.
        """
        runs = self.trial_runs()
        logged = 0
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL,
                                                          TrialState.PRUNED)):
            have = runs.get(t.number, [])
            done = [r for r in have if r.info.status in ("FINISHED", "FAILED", "KILLED")]
            for r in have:
                if r is not (done[0] if done else None):
                    self.client.delete_run(r.info.run_id)
            if done:
                continue
            attrs = trial_attrs(t)
            status = attrs.status or ("ok" if t.state == TrialState.COMPLETE else "failed")
            if status not in ("ok", "failed", "infeasible", "timeout", "stopped"):
                status = "failed"
            cons = dict(t.constraints or {}) if hasattr(t, "constraints") else {}
            feasible = t.state == TrialState.COMPLETE and status == "ok" and all(
                v <= 0 for v in cons.values())
            result = TrialResult(t.number, status, metrics=dict(attrs.metrics or {}),
                                 reason=str(attrs.reason), node=attrs.node, duration_s=attrs.duration_s,
                                 times_s=dict(attrs.times_s))
            log = self.study_dir / "trials" / f"{t.number:04d}" / "trial.log"
            self.log_trial(t.number, dict(attrs.params or t.params), result, feasible,
                           log if log.exists() else None)
            logged += 1
        return logged

    def finish(self, summary: StudySummary, files: list[Path], status: str = "FINISHED") -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(f"winner.{k}", float(v), now, 0) for k, v in summary.winner_metrics.items()
                   if isinstance(v, (int, float)) and math.isfinite(v)]
        if isinstance(summary.speedup, (int, float)):
            metrics.append(Metric("speedup", float(summary.speedup), now, 0))
        if metrics:
            self.client.log_batch(self.parent_id, metrics=metrics)
        h = summary.headroom
        for key, text in (("headroom", h and h.roofline_words()), ("energy", h and h.energy_words()),
                          ("constraints", "; ".join(summary.constraints))):  # a relative bound's number
            if text:  # the sentence, or why the number is unknown
                self.client.set_tag(self.parent_id, key, text[:5000])
        for f in files:
            if f.exists():
                self.client.log_artifact(self.parent_id, str(f))
        self.client.set_terminated(self.parent_id, status)
