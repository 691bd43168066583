"""MLflow tracking: one parent run per study, one nested run per trial.

Uses ``MlflowClient`` with explicit run ids (no fluent global state). The store is a
SQLite database under ``mlruns/`` (MLflow 3 refuses the old file store); artifacts go to
``mlruns/artifacts``. Open it with ``mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db``.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from autotune.config import Config
    from autotune.trial.spec import TrialResult

PARENT_ATTR = "mlflow_parent_run_id"


def _sqlite_dir(uri: str) -> None:
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)


def _params(params: dict[str, Any]) -> dict[str, str]:
    return {k: str(v)[:6000] for k, v in params.items()}


class Tracker:
    """Logs a study to MLflow. Not thread-safe: call it from the driver thread only."""

    def __init__(self, cfg: Config) -> None:
        os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow.tracking import MlflowClient

        _sqlite_dir(cfg.tracking.uri)
        self.client = MlflowClient(tracking_uri=cfg.tracking.uri)
        name = cfg.tracking.experiment or cfg.study.name
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            artifacts = Path(cfg.tracking.artifacts).resolve()
            artifacts.mkdir(parents=True, exist_ok=True)
            self.experiment_id = self.client.create_experiment(name, artifact_location=artifacts.as_uri())
        else:
            self.experiment_id = exp.experiment_id
        self.parent_id: str | None = None

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
            self.experiment_id, run_name=f"trial-{number:04d}",
            tags={"mlflow.parentRunId": self.parent_id, "autotune.trial": str(number)},
        )
        rid = run.info.run_id
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, 0) for k, v in result.metrics.items()
                   if isinstance(v, (int, float)) and math.isfinite(v)]
        tags = {"status": result.status, "feasible": str(feasible), "reason": result.reason[:5000],
                "node": result.node, "duration_s": f"{result.duration_s:.2f}"}
        self.client.log_batch(
            rid, metrics=metrics, params=[Param(k, v) for k, v in _params(params).items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        if log_path is not None and log_path.exists():
            self.client.log_artifact(rid, str(log_path))
        self.client.set_terminated(rid, "FINISHED" if result.ok else "FAILED")
        return rid

    def finish(self, summary: dict[str, Any], files: list[Path], status: str = "FINISHED") -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(f"winner.{k}", float(v), now, 0) for k, v in summary.get("winner_metrics", {}).items()
                   if isinstance(v, (int, float)) and math.isfinite(v)]
        if isinstance(summary.get("speedup"), (int, float)):
            metrics.append(Metric("speedup", float(summary["speedup"]), now, 0))
        if metrics:
            self.client.log_batch(self.parent_id, metrics=metrics)
        for f in files:
            if f.exists():
                self.client.log_artifact(self.parent_id, str(f))
        self.client.set_terminated(self.parent_id, status)
