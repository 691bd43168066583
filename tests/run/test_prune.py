"""A trial stopped early (issue 43): the rule the driver sends, and how it is told (real SQLite).

The rule: trial 0 never gets one; a search trial gets the constraints and, once something is
feasible, the incumbent; ``study.early_stop: false`` and samplers that ignore PRUNED trials
(nsga2, gp) get none. Told: Optuna's PRUNED, valued at its partial numbers, counted in the
budget, never feasible (so never a winner or a re-measured candidate), and bo's GPs train on it.
"""

from __future__ import annotations

import json

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from autotune.config.compose import compose
from autotune.config.schema import load_config
from autotune.config.validate import compile_space
from autotune.record import optuna_study as studylib
from autotune.run.prune import stop_rule
from autotune.search.samplers import make_sampler
from autotune.search.space import encode
from autotune.search.trials import Record
from autotune.trial.spec import TrialResult
from tests.conftest import study_overrides
from tests.helpers.cli import run_cli_here


def _cfg(tmp_path, *extra: str):
    return load_config(compose(["conf=local_cpu", f"study.dir={tmp_path}/s", "study.name=t",
                                'constraints=["ttft_p95_ms <= 2000"]', *extra]))


def _trial(study: optuna.Study, role: str | None = None) -> optuna.Trial:
    if role:
        study.enqueue_trial({}, user_attrs={"role": role})
    return study.ask()


def test_the_rule_carries_the_bounds_and_the_incumbent_and_never_reaches_trial_0(tmp_path):
    cfg = _cfg(tmp_path)
    study = optuna.create_study(direction="maximize")
    recs = [Record(0, {}, {"decode_tps": 50.0}), Record(1, {}, {"decode_tps": 70.0}, feasible=False),
            Record(2, {}, {"decode_tps": 60.0}), Record(3, {}, {"decode_tps": 90.0}, status="stopped",
                                                           feasible=False)]
    assert stop_rule(cfg, _trial(study, "baseline"), recs) is None  # trial 0
    study.enqueue_trial({}, user_attrs={"role": "rerun", "rerun_of": 0})
    assert stop_rule(cfg, study.ask(), recs) is None  # trial 0 re-run on resume
    first = stop_rule(cfg, _trial(study), [])
    assert first.incumbent is None and first.bounds == (("ttft_p95_ms", "<=", 2000.0),)
    rule = stop_rule(cfg, _trial(study), recs)
    assert (rule.objective, rule.maximize, rule.incumbent, rule.incumbent_trial) == ("decode_tps", True, 60.0, 2)


@pytest.mark.parametrize("override", ["study.early_stop=false", "study.sampler=nsga2"])
def test_no_rule_when_off_or_when_the_sampler_ignores_pruned_trials(tmp_path, override):
    cfg = _cfg(tmp_path, override)
    study = optuna.create_study(direction="maximize")
    _trial(study, "baseline")
    assert stop_rule(cfg, _trial(study), [Record(0, {}, {"decode_tps": 50.0})]) is None


def test_a_stopped_trial_is_pruned_with_its_partial_numbers_counted_and_never_feasible(tmp_path):
    cfg = _cfg(tmp_path)
    space = compile_space(cfg)
    sampler = make_sampler("bo", 0, space, 10, n_startup=2)
    study, _ = studylib.open_study(cfg, sampler)
    configs = [sampler.pool.params[i] for i in (0, 700, 1400)]  # launchable configurations
    results = [TrialResult(0, "ok", {"decode_tps": 50.0, "ttft_p95_ms": 300.0}),
               TrialResult(1, "ok", {"decode_tps": 60.0, "ttft_p95_ms": 250.0}),
               TrialResult(2, "stopped", {"decode_tps": 20.0, "ttft_p95_ms": 900.0},
                           reason="stopped early: decode_tps at most 21 cannot reach the incumbent 60 (trial #1)")]
    for params, result in zip(configs, results, strict=True):
        study.enqueue_trial({k: encode(v) for k, v in params.items()})
        t = study.ask()
        studylib.mark_launched(t, params, None)
        rec = studylib.tell(study, t, cfg, params, result)
    assert rec.status == "stopped" and not rec.feasible and rec.reason.startswith("stopped early:")
    frozen = study.trials[2]
    assert frozen.state == TrialState.PRUNED and frozen.value == 20.0  # its partial number, told
    assert studylib.n_launched(study) == 3  # counts toward the budget
    assert [r.feasible for r in studylib.records(study)] == [True, True, False]
    sampler.choose(study)
    assert sampler.last_sizes["train"] == 3  # bo's objective GP learns from the stopped trial too
    again = optuna.load_study(study_name="t", storage=cfg.storage_url)  # the same, read back
    assert again.trials[2].state == TrialState.PRUNED and again.trials[2].user_attrs["status"] == "stopped"



@pytest.mark.slow
@pytest.mark.e2e
def test_a_real_study_stops_trials_that_break_a_bound_and_says_so_everywhere(tmp_path):
    """Real llama.cpp, real Optuna storage, real MLflow: a TTFT bound no configuration meets.
    Trial 0 is measured whole (and is infeasible); trials 1 and 2 stop after their first batch."""
    enqueue = "[{n_threads: 1, n_batch: 128, n_ubatch: 128}, {n_threads: 2, n_batch: 256, n_ubatch: 256}]"
    args = ["run", "conf=local_cpu", "study.n_trials=3", f"study.enqueue={enqueue}", "quality.n_tokens=64",
            "workload.max_tokens=8", "workload.repeats=3", "select.top_k=0", "report.enabled=true",
            'constraints=["ttft_p95_ms <= 0.01"]', *study_overrides(tmp_path, "prune", seed_mlflow=True)]
    proc = run_cli_here(args, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    d = tmp_path / "studies" / "prune"
    trials = optuna.load_study(study_name="prune", storage=f"sqlite:///{d}/optuna.db").get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.PRUNED]
    for t in trials[1:]:
        assert t.user_attrs["reason"].startswith("stopped early: ttft_p95_ms <= 0.01 broken beyond noise")
        assert "quality" not in t.user_attrs["times_s"] and t.user_attrs["metrics"]["decode_tps"] > 0
        result = json.loads((d / "trials" / f"{t.number:04d}" / "result.json").read_text())
        assert result["status"] == "stopped" and len(result["samples"]["ttft_ms"]) == 2
        assert f"#{t.number} stopped early: ttft_p95_ms <= 0.01" in proc.stdout
    assert len(json.loads((d / "trials" / "0000" / "result.json").read_text())["samples"]["ttft_ms"]) == 3
    assert "1 failed, 2 stopped early" in proc.stdout or ", 2 stopped early;" in proc.stdout, proc.stdout[-2000:]
    assert json.loads((d / "summary.json").read_text())["n_stopped"] == 2
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    exp = client.get_experiment_by_name("prune")
    runs = client.search_runs([exp.experiment_id], "tags.`autotune.trial` = '1'")
    assert runs and runs[0].data.tags["status"] == "stopped"
    assert runs[0].data.tags["reason"].startswith("stopped early:")
    page = (d / "report" / "report.html").read_text()
    assert "stopped early: ttft_p95_ms &lt;= 0.01" in page or "stopped early: ttft_p95_ms <= 0.01" in page
