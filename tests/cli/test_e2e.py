"""End to end: a small real study on real llama.cpp with real Optuna, MLflow and Ray.

Checks the exports, the Optuna storage and the MLflow runs against each other, that
re-running the same command resumes the study, and that best.yaml is a usable preset.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from autotune.record.optuna_study import records
from autotune.record.summary import PredictionError
from autotune.search.select import pareto_front
from tests.conftest import run_cli
from tests.conftest import study_overrides
from tests.helpers.chromium import chromium_or_skip
from tests.helpers.cli import run_cli_here

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SMALL = [
    "conf=local_cpu", "study.n_trials=4", "quality.n_tokens=128", "workload.max_tokens=24",
    "workload.repeats=1", "select.top_k=2", "select.rerun_repeats=1",
    # a TTFT bound no trial breaks even on a shared 2-core box (the baseline's p95 passed 5 s
    # there): an infeasible baseline is never re-measured, and the checks below need it to be;
    # relative to trial 0's, as the default preset's is
    'constraints=["ppl_delta_pct <= 50", "ttft_p95_ms <= 20x baseline"]',
]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    args = ["run", *SMALL, *study_overrides(tmp, png=True)]  # a new MLflow store, as a user's
    first = run_cli(args, tmp, timeout=900)
    return tmp, args, first


def test_study_finishes_and_prints_the_winner(study):
    """The printed verdict is the one in summary.json, whichever it is: on a box where the
    engine defaults are already best (4 noisy trials), "keep them" is the right answer."""
    tmp, _, proc = study
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "baseline (trial 0, engine defaults) vs winner" in proc.stdout
    summary = json.loads((tmp / "studies" / "e2e" / "summary.json").read_text())
    assert summary["baseline"]["number"] == 0 and summary["speedup"] > 0
    if summary["winner"]["number"] == summary["baseline"]["number"]:
        assert summary["speedup"] == 1.0, summary
        assert "No configuration beat the engine defaults" in proc.stdout, proc.stdout
    else:
        assert f"speed-up over the engine default: {summary['speedup']:.2f}x" in proc.stdout, proc.stdout


def test_exports_match_the_optuna_storage(study):
    tmp, _, _ = study
    d = tmp / "studies" / "e2e"
    for name in ("pareto.json", "pareto.csv", "best.yaml", "summary.json", "llama-server.sh", "llama_cpp_kwargs.json"):
        assert (d / name).is_file(), name
    st = optuna.load_study(study_name="e2e", storage=f"sqlite:///{d}/optuna.db")
    trials = st.get_trials(deepcopy=False)
    assert sum(t.user_attrs["kind"] == "launched" for t in trials) == 4  # n_trials counts launched
    assert trials[0].user_attrs["role"] == "baseline"
    assert trials[0].params["n_threads"] >= 1 and trials[0].params["n_batch"] == 512
    pareto = json.loads((d / "pareto.json").read_text())
    # the front over every launched trial's measured objectives (not what the sampler was told)
    front = pareto_front([r for r in records(st) if r.kind == "launched"], ["decode_tps", "ttft_p95_ms"])
    assert [t["number"] for t in pareto["trials"]] == [r.number for r in front]
    for row in pareto["trials"]:
        t = trials[row["number"]]
        assert t.user_attrs["status"] == "ok"
        assert all(v <= 0 for v in t.constraints.values())
        assert math.isclose(row["metrics"]["decode_tps"], t.user_attrs["metrics"]["decode_tps"])
    summary = json.loads((d / "summary.json").read_text())
    assert summary["n_trials"] == 4 and summary["winner"] is not None
    assert summary["speedup"] > 0 and "remeasured" in summary
    kwargs = json.loads((d / "llama_cpp_kwargs.json").read_text())
    assert kwargs["n_threads"] == summary["winner"]["params"]["n_threads"]
    sh = (d / "llama-server.sh").read_text()
    assert "llama-server" in sh and "127.0.0.1" in sh


def test_the_run_ends_with_its_report(study):
    """report.html always; the PNGs where kaleido finds a Chromium (CI installs one)."""
    tmp, _, proc = study
    out = tmp / "studies" / "e2e" / "report"
    page = (out / "report.html").read_text()
    assert "id=\"history\"" in page and "id=\"pareto\"" in page
    prediction = json.loads((tmp / "studies" / "e2e" / "summary.json").read_text())["prediction"]
    lines = PredictionError(**prediction).lines()  # llama.cpp predicts memory and a decode bound
    assert lines and all(html.escape(x[1:]) in page for x in lines), page[-3000:]
    chromium_or_skip()
    drawn = [n for n in ("pareto", "history", "importance") if f"id='{n}-missing'" not in page]
    for name in drawn:  # a PNG of each plot on the page
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", proc.stderr[-2000:]


def test_mlflow_runs_match_the_optuna_trials(study):
    tmp, _, _ = study
    d = tmp / "studies" / "e2e"
    st = optuna.load_study(study_name="e2e", storage=f"sqlite:///{d}/optuna.db")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp}/mlruns/mlflow.db")
    exp = client.get_experiment_by_name("e2e")
    parent = st.user_attrs["mlflow_parent_run_id"]
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert len(runs) == len(st.get_trials(deepcopy=False))  # refused proposals are logged too
    by_trial = {int(r.data.tags["autotune.trial"]): r for r in runs}
    for t in st.get_trials(deepcopy=False):
        run = by_trial[t.number]
        assert run.data.tags["status"] == t.user_attrs["status"]
        for k, v in t.user_attrs["params"].items():
            assert run.data.params[k] == str(v)
        for k, v in t.user_attrs["metrics"].items():
            assert math.isclose(run.data.metrics[k], v, rel_tol=1e-9)
        if t.user_attrs["kind"] == "launched":  # refused and repeated proposals never ran
            assert any(a.path == "trial.log" for a in client.list_artifacts(run.info.run_id))
    assert client.get_run(parent).info.status == "FINISHED"
    base = st.user_attrs["relative_baseline"]["ttft_p95_ms"]  # [value, trial]: trial 0 measured it
    bound = f"ttft_p95_ms <= 20x baseline (= {20 * base[0]:.4g})"
    assert base[1] == 0 and base[0] == st.trials[0].user_attrs["metrics"]["ttft_p95_ms"]
    assert client.get_run(parent).data.tags["constraints"] == f"ppl_delta_pct <= 50; {bound}"
    names = {a.path for a in client.list_artifacts(parent)}
    assert {"config.yaml", "space.txt", "pareto.json", "summary.json", "report"} <= names  # report/ after the run


def test_best_yaml_is_a_usable_preset(study):
    tmp, _, _ = study
    d = tmp / "studies" / "e2e"
    best = yaml.safe_load((d / "best.yaml").read_text())
    assert all(v["type"] == "fixed" for v in best["space"].values())
    proc = run_cli_here(["run", "--config-dir", str(d), "conf=best", "--dry-run"], tmp)
    assert proc.returncode == 0, proc.stderr
    assert "space size: 1 configurations" in proc.stdout


def test_rerunning_the_command_resumes_the_study(study):
    tmp, args, _ = study
    args = [a if a != "study.n_trials=4" else "study.n_trials=5" for a in args]
    proc = run_cli_here(args + ["select.top_k=0"], tmp)  # the first run proved the entry point
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resuming (4 trials done)" in proc.stdout
    st = optuna.load_study(study_name="e2e", storage=f"sqlite:///{tmp}/studies/e2e/optuna.db")
    trials = st.get_trials(deepcopy=False)
    assert sum(t.user_attrs["kind"] == "launched" for t in trials) == 5
    assert sum(t.user_attrs.get("role") == "baseline" for t in trials) == 1
    assert Path(tmp, "studies", "e2e", "pareto.json").exists()


@pytest.mark.slow
def test_a_design_point_whose_context_trial_0_outgrew_is_moved_not_launched(tmp_path, tiny_moe):
    """The tiny MoE's byte-level vocabulary makes the 'short' prompts 557 tokens: llama-cpp-python's
    default n_ctx=512 (trial 0) overflows. The startup design was drawn before trial 0 ran; its
    points at n_ctx=512 are refused (not counted) and queued again at the smallest n_ctx that holds
    the 621 tokens, so no launch after trial 0 overflows and the design's other knobs still run.
    (Seen running `init` + `run` on it as a newcomer: 3 of 5 trials spent on n_ctx=512.)"""
    init = run_cli_here(["init", str(tiny_moe), "--engine", "llamacpp", "--out", "conf", "--name", "moe"], tmp_path)
    assert init.returncode == 0, init.stdout + init.stderr
    proc = run_cli_here(["run", "--config-dir", "conf", "conf=moe", "study.n_trials=4", "select.top_k=0"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    study = optuna.load_study(study_name="moe", storage=f"sqlite:///{tmp_path}/studies/moe/optuna.db")
    recs = {r.number: r for r in records(study)}
    assert recs[0].params["n_ctx"] == 512 and "too small for a 557-token prompt" in recs[0].reason
    moved = [r for r in recs.values() if r.reason.startswith("design point moved")]
    assert moved and all(r.kind == "rejected" and r.params["n_ctx"] == 512 for r in moved)
    launched = [r for r in recs.values() if r.kind == "launched" and r.number > 0]
    assert len(launched) == 3 and all(r.params["n_ctx"] >= 1024 for r in launched)
    keys = {tuple(sorted((k, v) for k, v in r.params.items() if k != "n_ctx")) for r in launched}
    assert any(tuple(sorted((k, v) for k, v in r.params.items() if k != "n_ctx")) in keys for r in moved)
