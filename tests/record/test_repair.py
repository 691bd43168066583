"""A truncated or garbage ``optuna.db``: every command says so in one line; ``repair`` rebuilds it.

One real fake-engine study is run; copies of its directory are damaged. After ``autotune
repair`` the study has every finished trial with the same parameters, values, constraints
and user attributes, and MLflow holds one finished run per Optuna trial.
"""

from __future__ import annotations

import shutil

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import run_cli
from tests.conftest import study_overrides
from tests.helpers.cli import run_cli_here

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
NAME = "rep"
VOLATILE = {"duration_s", "role"}  # rebuilt from trials/: measured from file times; role not on disk


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """(work dir, args) of a finished 5-trial study named ``rep``."""
    work = tmp_path_factory.mktemp("repair")
    args = ["run", "conf=fake_gpus", "study.n_trials=5", "report.enabled=false",
            *study_overrides(work, NAME, seed_mlflow=True)]
    done = run_cli(args, work, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return work, args


def load(path) -> list[optuna.trial.FrozenTrial]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=NAME, storage=f"sqlite:///{path}").trials


def damaged_copy(work, label: str, damage) -> tuple:
    """A copy of the study (and its MLflow store) with ``optuna.db`` damaged."""
    src = work / "studies" / NAME
    root = work / label
    shutil.copytree(src, root / "studies" / NAME)
    shutil.copytree(work / "mlruns", root / "mlruns")
    config = root / "studies" / NAME / "config.yaml"
    config.write_text(config.read_text().replace(str(work / "mlruns"), str(root / "mlruns")))
    db = root / "studies" / NAME / "optuna.db"
    db.write_bytes(damage(db.read_bytes()))
    return root, root / "studies" / NAME


def one_line(done, *words: str) -> None:
    err = [x for x in done.stderr.splitlines() if x.strip()]
    assert done.returncode == 2, done.stdout[-1500:] + done.stderr[-1500:]
    assert len(err) == 1 and "Traceback" not in done.stderr, done.stderr[-1500:]
    assert all(w in err[0] for w in ("optuna.db", "autotune repair", *words)), err[0]


@pytest.mark.parametrize(("label", "damage", "why", "keep_backup"), [
    ("truncated", lambda b: b[:len(b) // 2], "truncated", False),
    ("garbage", lambda b: b"\x13\x37 not sqlite " * 3000, "file is not a database", True),
])
def test_damaged_database_one_line_then_repair(study, label, damage, why, keep_backup):
    work, args = study
    root, d = damaged_copy(work, label, damage)
    if not keep_backup:
        (d / "optuna.db.bak").unlink()  # rebuild from trials/ alone
    # in this process (the fixture ran the real entry point), but `ui` in a subprocess: were
    # it to serve the damaged study, the timeout ends it instead of hanging the suite
    for cmd in (["ls", "studies"], ["report", str(d), "--no-png"], ["export", str(d)]):
        one_line(run_cli_here(cmd, root), why)
    one_line(run_cli(["ui", str(d), "--port", "5987"], root, timeout=120), why)
    run_args = [a for a in args if not a.startswith(("study.dir", "tracking."))]
    one_line(run_cli_here([*run_args, f"study.dir={d}", f"tracking.uri=sqlite:///{root}/mlruns/mlflow.db",
                           f"tracking.artifacts={root}/mlruns/artifacts"], root), why)

    fixed = run_cli_here(["repair", str(d)], root)
    assert fixed.returncode == 0, fixed.stdout[-2000:] + fixed.stderr[-2000:]
    assert "kept the damaged file" in fixed.stdout and "MLflow = Optuna" in fixed.stdout
    assert list(d.glob("optuna.db.corrupt-*"))
    source = "optuna.db.bak" if keep_backup else "trials/"
    assert f"5 from {source}" in fixed.stdout, fixed.stdout
    before, after = load(work / "studies" / NAME / "optuna.db"), load(d / "optuna.db")
    assert len(after) == len(before)
    for a, b in zip(before, after, strict=True):
        assert (a.number, a.state, a.params, a.values, a.constraints) == \
            (b.number, b.state, b.params, b.values, b.constraints)
        skip = set() if keep_backup else VOLATILE
        assert {k: v for k, v in a.user_attrs.items() if k not in skip} == \
            {k: v for k, v in b.user_attrs.items() if k not in skip}
    client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlruns/mlflow.db")
    exp = client.get_experiment_by_name(NAME)
    runs = [r for r in client.search_runs([exp.experiment_id], max_results=1000)
            if "mlflow.parentRunId" in r.data.tags]
    assert sorted(int(r.data.tags["autotune.trial"]) for r in runs) == [t.number for t in after]
    assert run_cli_here(["ls", "studies"], root).returncode == 0
    again = run_cli_here(["repair", str(d)], root)
    assert again.returncode == 2 and "nothing to repair" in again.stderr


def test_a_lost_database_is_listed_then_rebuilt_from_trials(study):
    """optuna.db and its backup deleted: ``ls`` still lists the study (one line naming the loss
    and ``autotune repair``), and repair rebuilds every trial from trials/."""
    work, _ = study
    root, d = damaged_copy(work, "lost", lambda b: b)
    for name in ("optuna.db", "optuna.db.bak", "optuna.db-wal", "optuna.db-shm"):
        (d / name).unlink(missing_ok=True)
    listed = run_cli_here(["ls", "studies"], root)
    one_line(listed, "missing")
    fixed = run_cli_here(["repair", str(d)], root)
    assert fixed.returncode == 0, fixed.stdout[-2000:] + fixed.stderr[-2000:]
    assert "missing" in fixed.stdout and "5 from trials/" in fixed.stdout, fixed.stdout
    before = load(work / "studies" / NAME / "optuna.db")
    assert [(t.number, t.params) for t in load(d / "optuna.db")] == [(t.number, t.params) for t in before]
    assert run_cli_here(["ls", "studies"], root).returncode == 0
