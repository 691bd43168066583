"""How results are told to Optuna: constraints, infeasible/failed trials, resume (real SQLite)."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config.compose import compose
from autotune.config.schema import load_config
from autotune.config.validate import compile_space
from autotune.errors import ConfigError
from autotune.record import optuna_study as studylib
from autotune.search import trials as trialslib
from autotune.search.samplers import make_sampler
from autotune.search.select import pareto_front
from autotune.search.space import baseline_params
from autotune.trial.spec import TrialResult


@pytest.fixture
def setup(tmp_path):
    cfg = load_config(compose(["conf=local_cpu", f"study.dir={tmp_path}/s", "study.name=t",
                               "study.search=pareto"]))
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


def _study(tmp_path, *overrides):
    cfg = load_config(compose(["conf=local_cpu", f"study.dir={tmp_path}/s", "study.name=t", *overrides]))
    space = compile_space(cfg)
    return cfg, space, studylib.open_study(cfg, make_sampler("tpe", 0, space, 10))[0]


@pytest.mark.parametrize(("overrides", "directions", "told"), [
    ([], ["maximize"], [90.0]),  # single (default): select.metric decode_tps only
    (["study.search=pareto"], ["maximize", "minimize"], [90.0, 150.0]),
    (["select.metric=ttft_p95_ms"], ["minimize"], [150.0]),
    (["select.rule=weighted", "+select.weights.decode_tps=1.0"], ["maximize"], [pytest.approx(4.5108, 1e-4)]),
])
def test_search_mode_sets_directions_and_told_values(tmp_path, overrides, directions, told):
    cfg, _, st = _study(tmp_path, *overrides)
    assert studylib.directions(cfg) == directions
    assert [d.name.lower() for d in st.directions] == directions
    t = st.ask()
    studylib.tell(st, t, cfg, {"a": 1}, _ok(t.number, 90.0, 150.0))
    assert st.trials[0].values == told


def test_resuming_under_another_search_mode_is_refused(tmp_path):
    _study(tmp_path)
    with pytest.raises(ConfigError, match="study.search"):
        _study(tmp_path, "study.search=pareto")


def test_pareto_front_comes_from_measured_metrics_not_from_told_values(tmp_path):
    cfg, _, st = _study(tmp_path)  # single: the sampler only sees decode_tps
    for decode, ttft in ((90.0, 250.0), (70.0, 100.0), (60.0, 200.0)):
        t = st.ask()
        studylib.tell(st, t, cfg, {"n": t.number}, _ok(t.number, decode, ttft))
    assert [t.number for t in st.best_trials] == [0]  # what Optuna knows: one best value
    front = pareto_front(studylib.records(st), ["decode_tps", "ttft_p95_ms"])
    assert [r.number for r in front] == [0, 1]  # #2 is dominated by #1


def test_kinds_count_only_launched_trials(tmp_path):
    cfg, _, st = _study(tmp_path)
    for kind, result in ((trialslib.LAUNCHED, _ok(0, 80.0, 100.0)),
                         (trialslib.REJECTED, TrialResult(1, "infeasible", reason="rule: x")),
                         (trialslib.DUPLICATE, _ok(2, 80.0, 100.0)),
                         (trialslib.LAUNCHED, TrialResult(3, "failed", reason="boom"))):
        studylib.tell(st, st.ask(), cfg, {}, result, kind=kind)
    studylib.tell_fail(st, st.ask(), {"a": 1}, trialslib.INTERRUPTED, "interrupted")
    assert studylib.n_launched(st) == 2 and studylib.n_finished(st) == 5
    assert [r.kind for r in studylib.records(st)] == ["launched", "rejected", "duplicate", "launched",
                                                     "interrupted"]
    assert st.trials[1].state == TrialState.COMPLETE, "a refused proposal is told, so the sampler learns"
    assert st.trials[1].constraints[studylib.RUN_OK] == 1.0


def test_interrupted_trial_is_requeued_once_with_its_configuration(tmp_path):
    cfg, space, st = _study(tmp_path)
    studylib.enqueue_initial(st, space, baseline_params(space, cfg.engine.variants), [])
    t = st.ask()  # trial 0 launched, then the driver is killed: it stays RUNNING
    params = space.suggest(t)
    t.set_user_attr("kind", trialslib.LAUNCHED)
    st2, resumed = studylib.open_study(cfg, make_sampler("tpe", 0, space, 10))
    assert resumed and st2.trials[0].user_attrs["kind"] == trialslib.INTERRUPTED
    assert studylib.n_launched(st2) == 0  # the interrupted run does not count
    assert studylib.requeue_interrupted(st2) == [0]
    assert studylib.requeue_interrupted(st2) == []  # not twice
    again = st2.ask()
    assert again.user_attrs == {"role": "rerun", "rerun_of": 0} and space.suggest(again) == params


def test_an_enqueued_trial_killed_before_suggest_is_requeued(tmp_path):
    cfg, space, st = _study(tmp_path)
    studylib.enqueue_initial(st, space, baseline_params(space, cfg.engine.variants), [])
    st.ask()  # trial 0 popped from the queue, killed before suggest(): no params yet
    st2, _ = studylib.open_study(cfg, make_sampler("tpe", 0, space, 10))
    assert st2.trials[0].params == {} and studylib.requeue_interrupted(st2) == [0]
    assert space.suggest(st2.ask()) == baseline_params(space, cfg.engine.variants)


def test_a_relative_bound_judges_once_its_baseline_is_known_and_the_study_keeps_it(setup):
    """``ttft_p95_ms <= 1.5x baseline`` (the default preset's): unknown, it judges nothing and
    is named by ``unresolved``; set from a baseline kept in the study, it judges like an
    absolute bound of 1.5 times that value, under the same name."""
    cfg, space, st, _ = setup
    rel = "ttft_p95_ms <= 1.5x baseline"
    assert studylib.unresolved(cfg) == ["ttft_p95_ms"]
    assert studylib.constraint_values(cfg, {"ttft_p95_ms": 9e9, "ppl_delta_pct": 0.0})[rel] == 0.0
    assert studylib.constraint_values(cfg, {"ppl_delta_pct": 0.0})[rel] == 1.0  # not measured: broken
    assert studylib.with_baseline(cfg, None) is cfg
    studylib.set_study_attr(st, studylib.BASELINE_ATTR, {"ttft_p95_ms": [400.0, 2]})  # trial 0 failed
    bound = studylib.with_baseline(cfg, studylib.study_attr(st, studylib.BASELINE_ATTR))
    assert studylib.unresolved(bound) == [] and cfg.constraints[1].factor == 1.5
    [c] = [c for c in bound.constraints if c.factor is not None]
    assert (str(c), c.bound, c.describe()) == (rel, 600.0, f"{rel} (= 600)")
    values = studylib.constraint_values(bound, {"ttft_p95_ms": 660.0, "ppl_delta_pct": 0.0})
    assert values[rel] == pytest.approx(0.1)
    t = st.ask()
    rec = studylib.tell(st, t, bound, {}, _ok(t.number, 90.0, 590.0))
    assert rec.feasible and rec.violations[rel] == pytest.approx(-10 / 600)
    assert studylib.with_baseline(bound, {"ttft_p95_ms": [9.0, 5]}) is bound, "a set bound stays"
