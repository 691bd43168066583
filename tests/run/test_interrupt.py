"""Ctrl-C: trials in flight are stopped whole, what is done is exported, exit code 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest

from autotune.record.optuna_study import INTERRUPTED
from autotune.record.optuna_study import LAUNCHED
from tests.conftest import study_overrides
from tests.helpers.procs import processes_with_arg

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_sigint_mid_study_exports_and_leaves_no_process(tmp_path):
    args = [sys.executable, "-m", "autotune.cli", "run", "conf=local_cpu", "study.n_trials=20",
            "quality.enabled=false", "workload.repeats=50", "workload.max_tokens=32",
            *study_overrides(tmp_path, "intr", seed_mlflow=True)]
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []
    deadline = time.monotonic() + 300
    try:
        for line in proc.stdout:
            lines.append(line)
            if "#0 started" in line or time.monotonic() > deadline:
                break
        time.sleep(4.0)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines) + out
    assert proc.returncode == 130, text[-3000:]
    d = tmp_path / "studies" / "intr"
    summary = json.loads((d / "summary.json").read_text())
    assert summary["interrupted"] is True
    # the trial cut off is kept, marked interrupted: a resume re-runs it outside the budget
    study = optuna.load_study(study_name="intr", storage=f"sqlite:///{d / 'optuna.db'}")
    cut = [t for t in study.trials if t.user_attrs.get("kind") == INTERRUPTED]
    assert cut and summary["n_trials"] == sum(
        t.user_attrs.get("kind") == LAUNCHED for t in study.trials), text[-3000:]
    assert (d / "pareto.json").exists()
    time.sleep(2.0)
    assert processes_with_arg(str(d)) == [], "a trial process outlived the interrupted study"
