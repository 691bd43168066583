"""Tracker.reconcile: Optuna's storage is the truth; MLflow gets exactly one run per trial.

Real Optuna SQLite storage and a real MLflow SQLite store in tmp_path; the gaps a SIGKILL
leaves (a trial told to Optuna but never logged, a run left RUNNING half-logged) are made by
calling the same methods the driver calls and stopping in between.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autotune.config.compose import compose
from autotune.config.schema import load_config
from autotune.record import optuna_study as studylib
from autotune.record.tracking import Tracker
from autotune.trial.spec import TrialResult


@pytest.fixture(scope="module")
def mlruns(tmp_path_factory) -> Path:
    """One MLflow store for the module (creating its schema takes seconds); one experiment per test."""
    return tmp_path_factory.mktemp("mlruns")


@pytest.fixture
def cfg(tmp_path: Path, mlruns: Path, request):
    name = request.node.name.removeprefix("test_")[:40]
    return load_config(compose([
        "conf=fake_gpus", f"study.name={name}", f"study.dir={tmp_path}/studies/rec",
        f"tracking.uri=sqlite:///{mlruns}/mlflow.db", f"tracking.artifacts={mlruns}/artifacts",
    ]))


def _study(cfg):
    study, _ = studylib.open_study(cfg, optuna.samplers.RandomSampler(seed=0))
    return study


def _tell(study, cfg, status: str, tps: float = 100.0):
    trial = study.ask()
    params = {"x": trial.suggest_float("x", 0, 1)}
    metrics = {"decode_tps": tps, "ttft_p95_ms": 10.0} if status == "ok" else {}
    result = TrialResult(trial.number, status, metrics, reason="" if status == "ok" else "boom")
    record = studylib.tell(study, trial, cfg, params, result)
    return trial.number, params, result, record


def _children(tracker: Tracker) -> dict[int, list]:
    return tracker.trial_runs()


def test_reconcile_logs_missing_and_replaces_half_logged_runs(cfg, tmp_path: Path):
    study = _study(cfg)
    tracker = Tracker(cfg)
    tracker.start_study("rec", None, {})
    told = [_tell(study, cfg, s) for s in ("ok", "failed", "ok", "timeout", "ok")]
    # trial 0 and 1 were logged; 2 was left RUNNING by a kill in log_trial; 3 and 4 never logged
    for number, params, result, record in told[:2]:
        tracker.log_trial(number, params, result.replace(status=record.status), record.feasible, None)
    half = tracker.client.create_run(tracker.experiment_id, run_name="trial-0002", tags={
        "mlflow.parentRunId": tracker.parent_id, "autotune.trial": "2"})
    log = tmp_path / "studies" / "rec" / "trials" / "0003" / "trial.log"
    log.parent.mkdir(parents=True)
    log.write_text("the log of trial 3\n")
    study.ask()  # a trial still RUNNING in Optuna is not logged (it has no result yet)

    assert tracker.reconcile(study) == 3
    runs = _children(tracker)
    assert sorted(runs) == [0, 1, 2, 3, 4]
    assert all(len(v) == 1 for v in runs.values())
    assert all(v[0].info.status in ("FINISHED", "FAILED") for v in runs.values())
    assert runs[2][0].info.run_id != half.info.run_id
    assert tracker.client.get_run(half.info.run_id).info.lifecycle_stage == "deleted"
    r3 = runs[3][0]
    assert r3.data.tags["status"] == "timeout" and r3.data.tags["reason"] == "boom"
    assert r3.info.status == "FAILED"
    assert [a.path for a in tracker.client.list_artifacts(r3.info.run_id)] == ["trial.log"]
    r4 = runs[4][0]
    assert r4.data.metrics["decode_tps"] == 100.0 and r4.data.params["x"] == str(told[4][1]["x"])
    assert r4.info.status == "FINISHED" and r4.data.tags["feasible"] in ("True", "False")
    assert tracker.reconcile(study) == 0  # idempotent


def test_reconcile_after_a_new_tracker_on_resume(cfg):
    """A resumed driver builds a new Tracker on the same parent run and fills the gaps."""
    study = _study(cfg)
    first = Tracker(cfg)
    parent = first.start_study("rec", None, {})
    _tell(study, cfg, "ok")
    _tell(study, cfg, "failed")
    second = Tracker(cfg)
    assert second.start_study("rec", parent, {}) == parent
    assert second.reconcile(study) == 2
    assert sorted(second.trial_runs()) == [0, 1]


def test_fail_ends_the_parent_run_failed(cfg):
    tracker = Tracker(cfg)
    parent = tracker.start_study("rec", None, {})
    assert tracker.client.get_run(parent).info.status == "RUNNING"
    tracker.fail("quality.reference: the reference configuration failed")
    run = tracker.client.get_run(parent)
    assert run.info.status == "FAILED"
    assert run.data.tags["autotune.error"].startswith("quality.reference")


@pytest.mark.slow
def test_a_driver_killed_while_mlflow_creates_its_store_leaves_one_the_next_opens(tmp_path: Path):
    """SIGKILL while MLflow migrates a new store (seconds on a fresh box): the next driver opens
    it. A half-migrated ``mlflow.db`` once refused every later run ("duplicate column name")."""
    store = tmp_path / "mlruns"
    overrides = ["conf=fake_gpus", "study.name=killed", f"study.dir={tmp_path}/studies/killed",
                 f"tracking.uri=sqlite:///{store}/mlflow.db", f"tracking.artifacts={store}/artifacts"]
    code = ("import sys; from autotune.config.compose import compose; from autotune.config.schema import "
            "load_config; from autotune.record.tracking import Tracker; Tracker(load_config(compose(sys.argv[1:])))")
    proc = subprocess.Popen([sys.executable, "-c", code, *overrides], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not any(f.stat().st_size for f in store.glob("mlflow.db*")) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(1.0)  # migrations under way (they take seconds)
        assert proc.poll() is None, "the store was made before the kill: nothing tested"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    tracker = Tracker(load_config(compose(overrides)))
    assert tracker.start_study("killed", None, {})
    assert sorted(f.name for f in store.glob("mlflow.db*")) == ["mlflow.db"]
