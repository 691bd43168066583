"""Resuming a study with another config: refused when measurements would mix, noted otherwise.

One real fake-engine study; each refused change exits 2 in one line before anything is
written (``config.yaml`` unchanged; the quality reference and model files, which the fake
engine lacks, are covered in test_storage); a comparable change resumes with a note; ``--fork``
starts a new study that measures the old one's compatible configurations first.
"""

from __future__ import annotations

import optuna
import pytest

from autotune.record.optuna_study import LAUNCHED
from autotune.record.resume import FORKED_ATTR
from tests.conftest import run_cli
from tests.conftest import study_overrides
from tests.helpers.cli import run_cli_here

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    work = tmp_path_factory.mktemp("resume")
    args = ["run", "conf=fake_gpus", "study.n_trials=4", "report.enabled=false",
            "select.top_k=0", *study_overrides(work, "res", seed_mlflow=True)]
    done = run_cli(args, work, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return work, args


@pytest.mark.parametrize(("override", "what"), [
    ("workload.repeats=4", "workload (workload.repeats 3 -> 4)"),
    ("workload.max_tokens=32", "workload"),
    ("objectives=[decode_tps]", "objectives"),
    ('constraints=["ttft_p50_ms <= 25"]', "constraint metrics"),
])
def test_incomparable_change_is_refused_in_one_line(study, override, what):
    work, args = study
    config = (work / "studies" / "res" / "config.yaml").read_text()
    done = run_cli_here([*args, override], work)  # the fixture ran the real entry point
    err = [x for x in done.stderr.splitlines() if x.strip()]
    assert done.returncode == 2 and len(err) == 1, done.stdout[-1500:] + done.stderr[-1500:]
    assert what in err[0] and "study.name=res-2" in err[0] and "--fork res-2" in err[0], err[0]
    assert (work / "studies" / "res" / "config.yaml").read_text() == config  # nothing written


def test_comparable_change_resumes_with_a_note_and_fork_seeds_a_new_study(study):
    work, args = study
    more = [a for a in args if not a.startswith("study.n_trials")] + ["study.n_trials=5",
                                                                        "space.x.high=0.9"]
    done = run_cli_here(more, work)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "resuming with a changed budget, space" in done.stdout, done.stdout[-2000:]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    old = optuna.load_study(study_name="res", storage=f"sqlite:///{work}/studies/res/optuna.db")
    assert sum(t.user_attrs.get("kind") == LAUNCHED for t in old.trials) == 5

    fork = run_cli_here([*args, "workload.repeats=4", "--fork", "res-w4"], work)
    assert fork.returncode == 0, fork.stdout[-2000:] + fork.stderr[-2000:]
    assert "forked from study res" in fork.stdout
    new = optuna.load_study(study_name="res-w4", storage=f"sqlite:///{work}/studies/res-w4/optuna.db")
    assert new.user_attrs.get(FORKED_ATTR) == "res"
    seeded = [t for t in new.trials if t.user_attrs.get("role") == "enqueued"]
    ok = {t.user_attrs["params"]["x"] for t in old.trials if t.user_attrs.get("status") == "ok"}
    assert seeded and all(t.user_attrs["params"]["x"] in ok for t in seeded)
    again = run_cli_here([*args, "workload.repeats=4", "--fork", "res-w4"], work)
    assert again.returncode == 2 and "exists already" in again.stderr
