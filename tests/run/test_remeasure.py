"""The end-of-study re-measurement when the baseline wins (a real fake-engine study, in-process)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import study_overrides
from tests.helpers.cli import run_cli_here

pytestmark = pytest.mark.slow


def test_a_baseline_that_wins_is_neither_its_own_runner_up_nor_judged_against_itself(tmp_path):
    # one launched trial: the baseline is the top candidate and the baseline at once
    args = ["run", "conf=fake_gpus", "study.n_trials=1", "select.top_k=1", "select.rerun_repeats=2",
            "report.enabled=false", *study_overrides(tmp_path, "solo", seed_mlflow=True)]
    proc = run_cli_here(args, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "studies" / "solo" / "summary.json").read_text())
    assert summary["winner"]["number"] == summary["baseline"]["number"] == 0
    assert summary["speedup"] == 1.0
    assert "runner_up" not in summary and "lead_within_noise" not in summary, summary
    assert "speedup_within_noise" not in summary, summary
    assert "lead over #0" not in proc.stdout and "No configuration beat the engine defaults" in proc.stdout
