"""How a study looks in MLflow: the experiment's view, run names, metric units, the report.

- MLflow 3 opens an experiment without a kind on its GenAI overview ("No data available");
  the tag ``mlflow.experimentKind = custom_model_development`` makes it open on the runs
  table, where the trials are compared.
- Metric units: MLflow metrics have no unit field, so each metric's unit and definition
  (from the registry in :mod:`objectives`) go into the experiment's description
  (``mlflow.note.content``, shown above the runs) and a tag ``unit.<metric>`` per metric.
- Trial runs are named by the parameters that vary in the space (``#0003 model=q4_0
  n_threads=2 ...``), so the runs table reads without opening each run.
- :func:`log_report` logs ``autotune report``'s HTML and PNGs to the study's parent run.
- :func:`quiet` keeps MLflow's and alembic's database set-up lines off the console.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from autotune.config.schema import Config

PARENT_ATTR = "mlflow_parent_run_id"  # Optuna study user attribute: the parent run's id
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
NOTE_TAG = "mlflow.note.content"
NAME_LIMIT = 250


def quiet() -> None:
    """Silence MLflow's store set-up logging (table creation, alembic migrations)."""
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    for name in ("mlflow", "alembic", "alembic.runtime.migration", "mlflow.store.db.utils"):
        logging.getLogger(name).setLevel(logging.WARNING)


def varying_params(space: dict) -> list[str]:
    """Names of the space's parameters that are not fixed."""
    return [k for k, v in (space or {}).items() if not (isinstance(v, dict) and v.get("type") == "fixed")]


def run_name(number: int, params: dict[str, Any], varying: list[str]) -> str:
    """``#0003 model=q4_0 n_threads=2 ...``: the trial number and its varying parameters."""
    shown = " ".join(f"{k}={params[k]}" for k in varying if k in params)
    return f"#{number:04d} {shown}".strip()[:NAME_LIMIT]


def units_note(metrics: list[str]) -> str:
    """Markdown table of metric, unit, direction and definition (the experiment description)."""
    from autotune.objectives import all_metrics

    known = all_metrics()
    rows = [f"| `{n}` | {known[n].unit or '-'} | {known[n].direction} | {known[n].description} |"
            for n in metrics if n in known]
    return ("autotune study. Each child run is one trial (params = the configuration, metrics = "
            "what was measured); the parent run holds the config, the exports and the report.\n\n"
            "| metric | unit | better | definition |\n|---|---|---|---|\n" + "\n".join(rows))


def describe_experiment(client: Any, experiment_id: str, metrics: list[str]) -> None:
    """Tag the experiment to open on its runs, with metric units in its description and tags."""
    from autotune.objectives import all_metrics

    known = all_metrics()  # the study's objectives and constraints first, then every metric
    names = [n for n in dict.fromkeys([*metrics, *sorted(known)]) if n in known]
    client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    client.set_experiment_tag(experiment_id, NOTE_TAG, units_note(names))
    for n in names:
        client.set_experiment_tag(experiment_id, f"unit.{n}", known[n].unit or "-")


def _experiment(config: Config, client: Any) -> Any:
    return client.get_experiment_by_name(config.tracking.experiment or config.study.name)


def experiment_url(base: str, config: Config) -> str:
    """The MLflow UI address of the study's experiment, on its runs table."""
    from mlflow.tracking import MlflowClient

    quiet()
    exp = _experiment(config, MlflowClient(tracking_uri=config.tracking.uri))
    if exp is None:
        return base
    return f"{base}/#/experiments/{exp.experiment_id}/runs"


def log_report(uri: str, parent: str, files: list[Path]) -> None:
    """Log the report files as artifacts (``report/``) of the study's parent run."""
    from mlflow.tracking import MlflowClient

    quiet()
    client = MlflowClient(tracking_uri=uri)
    for f in files:
        client.log_artifact(parent, str(f), artifact_path="report")
