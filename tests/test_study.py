"""How results are told to Optuna: constraints, infeasible/failed trials, resume (real SQLite)."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from autotune import study as studylib
from autotune.compose import compose
from autotune.config import load_config
from autotune.samplers import make_sampler
from autotune.space import baseline_params
from autotune.space import compile_space
from autotune.trial.spec import TrialResult


@pytest.fixture
def setup(tmp_path):
    cfg = load_config(compose(["conf=local_cpu", f"study.dir={tmp_path}/s", "study.name=t"]))
    space = compile_space(cfg)
    sampler = make_sampler("tpe", 0, space, 10)
    st, resumed = studylib.open_study(cfg, sampler)
    return cfg, space, st, resumed


def _ok(n: int, decode: float, ttft: float, ppl: float = 0.5) -> TrialResult:
    return TrialResult(n, "ok", {"decode_tps": decode, "ttft_p95_ms": ttft, "ppl_delta_pct": ppl})


def test_ok_trial_feasible_and_infeasible_by_constraint(setup):
    cfg, space, st, resumed = setup
    assert not resumed
    t = st.ask()
    rec = studylib.tell(st, t, cfg, {"a": 1}, _ok(t.number, 70.0, 150.0))
    assert rec.feasible
    t2 = st.ask()
    rec2 = studylib.tell(st, t2, cfg, {"a": 2}, _ok(t2.number, 90.0, 150.0, ppl=4.0))
    assert not rec2.feasible and rec2.violations["ppl_delta_pct <= 2"] == pytest.approx(1.0)
    frozen = st.trials[t2.number]
    assert frozen.state == TrialState.COMPLETE and frozen.constraints["ppl_delta_pct <= 2"] > 0
    assert [x.number for x in st.best_trials] == [t.number]


def test_failed_trial_is_told_with_worst_values_and_a_violation(setup):
    cfg, space, st, _ = setup
    a = st.ask()
    studylib.tell(st, a, cfg, {}, _ok(a.number, 70.0, 150.0))
    b = st.ask()
    studylib.tell(st, b, cfg, {}, _ok(b.number, 50.0, 250.0))
    c = st.ask()
    rec = studylib.tell(st, c, cfg, {}, TrialResult(c.number, "failed", reason="boom"))
    frozen = st.trials[c.number]
    assert frozen.state == TrialState.COMPLETE, "samplers must see crashes (FAIL trials are ignored)"
    assert frozen.values == [50.0, 250.0]
    assert frozen.constraints[studylib.RUN_OK] == 1.0
    assert frozen.user_attrs["reason"] == "boom" and not rec.feasible


def test_first_trial_failing_is_a_fail_state(setup):
    cfg, space, st, _ = setup
    t = st.ask()
    studylib.tell(st, t, cfg, {}, TrialResult(t.number, "timeout", reason="slow"))
    assert st.trials[0].state == TrialState.FAIL


def test_missing_objective_metric_fails_the_trial(setup):
    cfg, space, st, _ = setup
    t = st.ask()
    rec = studylib.tell(st, t, cfg, {}, TrialResult(t.number, "ok", {"decode_tps": 10.0}))
    assert rec.status == "failed" and "ttft_p95_ms" in rec.reason


def test_resume_marks_interrupted_trials_failed_and_keeps_the_baseline(setup, tmp_path):
    cfg, space, st, _ = setup
    studylib.enqueue_initial(st, space, baseline_params(space, cfg.engine.variants), [{"n_threads": 2}])
    t = st.ask()
    assert space.suggest(t) == baseline_params(space, cfg.engine.variants)
    st2, resumed = studylib.open_study(cfg, make_sampler("tpe", 0, space, 10))
    assert resumed
    first = st2.trials[0]
    assert first.state == TrialState.FAIL and "interrupted" in first.user_attrs["reason"]
    waiting = st2.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].system_attrs["fixed_params"]["n_threads"] == 2


def test_records_round_trip(setup):
    cfg, space, st, _ = setup
    t = st.ask()
    studylib.tell(st, t, cfg, {"n_threads": 2}, _ok(t.number, 70.0, 150.0))
    (rec,) = studylib.records(st)
    assert rec.params == {"n_threads": 2} and rec.metrics["decode_tps"] == 70.0 and rec.feasible
    assert isinstance(optuna.load_study(study_name="t", storage=cfg.storage_url), optuna.Study)
