"""Smoke version of bench/soak.py: a faulty study SIGKILLed and resumed loses nothing.

The real CLI on the fake engine (crash, hang, OOM, NaN, garbage, slow start, a child that
ignores SIGTERM), real Ray, Optuna and MLflow; the bench checks Optuna, MLflow and /proc.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_soak_smoke(tmp_path: Path):
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--smoke", "--trial-timeout", "10",
         "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    detail = proc.stdout[-3000:]
    assert res["kills"] == 1 and res["final_exit"] == 0, detail
    assert res["faulty_planned"] == 7, detail  # one of each: crash, hang, OOM, NaN, garbage, slow, stubborn
    assert res["lost"] == 0 and res["duplicates"] == 0, detail
    assert res["measured"] == 16, detail
    assert res["sigterm_exits"] == [143], detail  # the SIGTERM came while trials ran
    assert res["rival_refused"] is True and res["stack_dumps"] == 0, detail
    assert res["running"] == 0 and res["waiting"] == 0, detail
    assert res["mlflow_missing"] == 0 and res["mlflow_extra"] == 0, detail
    assert res["mlflow_parents"] == 1 and res["parent_status"] == "FINISHED", detail
    assert not any(res["processes_left"].values()), detail
    assert res["leases_held"] == 0, detail
    assert res["ok"] is True and proc.returncode == 0, detail
