"""The driver's budget on the fake GPU engine: what is launched, refused, reused and re-run.

Real driver, real Optuna (SQLite in tmp_path), real local Ray and real trial subprocesses;
each fake trial records its start from inside itself, so "never launched" is checked by
the absence of that record and of the trial's work directory.
"""

from __future__ import annotations

import _thread
import io
import json

import optuna
import pytest
from rich.console import Console

from autotune.config.schema import load_config
from autotune.config.validate import compile_space
from autotune.output.report import Reporter
from autotune.record.optuna_study import records
from autotune.record.summary import StudySummary
from autotune.run.driver import Driver
from autotune.run.placement import Placement
from autotune.search.design import config_key
from autotune.search.select import pareto_front
from tests.helpers.ray_cluster import WhenStarted
from tests.helpers.ray_cluster import fake_config
from tests.helpers.ray_cluster import run_study
from tests.helpers.ray_cluster import trial_events

pytestmark = pytest.mark.slow
FAST = ["space.duration_s.value=0.0", "ray.max_concurrent=1"]


def _with_rules(cfg_space, rules):
    cfg, _ = cfg_space
    data = dict(cfg.raw)
    data["rules"] = rules
    cfg = load_config(data)
    return cfg, compile_space(cfg)


def _trials(cfg) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=cfg.study.name, storage=cfg.storage_url).get_trials()


def _started(cfg) -> dict[int, dict]:
    return {n: ev["start"] for n, ev in trial_events(cfg).items() if "start" in ev}


def test_refused_proposals_are_reasked_and_not_counted(local_ray, tmp_path):
    cfg, space = _with_rules(fake_config(tmp_path, ["study.n_trials=6", *FAST]), ["y >= 0.4"])
    summary, log = run_study(cfg, space)
    trials = _trials(cfg)
    launched = [t for t in trials if t.user_attrs["kind"] == "launched"]
    refused = [t for t in trials if t.user_attrs["kind"] == "rejected"]
    assert len(launched) == 6 == summary["n_trials"], log
    assert refused and summary["n_rejected"] == len(refused), "seed 0 proposes some y < 0.4"
    for t in refused:
        assert t.user_attrs["reason"].startswith("rule: ") and t.params["y"] < 0.4
        assert t.state == optuna.trial.TrialState.COMPLETE  # told, so the sampler learns
        assert not (tmp_path / "study" / "trials" / f"{t.number:04d}").exists()
    started = _started(cfg)
    assert sorted(started) == sorted(t.number for t in launched)
    assert all(ev["params"]["y"] >= 0.4 for ev in started.values()), "a rule-breaking config ran"
    # single search (default): one direction; the exported front still uses every objective
    st = optuna.load_study(study_name=cfg.study.name, storage=cfg.storage_url)
    assert len(st.directions) == 1 and summary["search"] == "single"
    front = pareto_front([r for r in records(st) if r.kind == "launched"], ["decode_tps", "ttft_p95_ms"])
    exported = json.loads((tmp_path / "study" / "pareto.json").read_text())
    assert [r["number"] for r in exported["trials"]] == [r.number for r in front]


def test_a_sampler_stuck_on_refused_proposals_ends_with_one_line(local_ray, tmp_path):
    cfg, space = _with_rules(fake_config(tmp_path, ["study.n_trials=5", "study.max_rejected=4", *FAST]),
                             ["x >= 0.99 or y == 0.5"])  # only the baseline (y=0.5) passes, in practice
    summary, log = run_study(cfg, space)
    assert summary["n_trials"] == 1 and summary["n_rejected"] == 4, log
    assert "stopped: 4 proposals in a row could not be launched (study.max_rejected=4)" in summary["stop_reason"]
    assert summary["stop_reason"] in " ".join(log.split())
    assert sorted(_started(cfg)) == [0]


def test_a_measured_configuration_is_never_launched_again(local_ray, tmp_path):
    space = {"x": {"type": "fixed", "value": 0.7}, "y": {"type": "fixed", "value": 0.3}}
    cfg, space = fake_config(tmp_path, ["study.n_trials=4", "study.max_rejected=6", *FAST], space=space)
    summary, log = run_study(cfg, space)  # two configurations exist: gpus=1 and gpus=2
    trials = _trials(cfg)
    launched = [t for t in trials if t.user_attrs["kind"] == "launched"]
    dups = [t for t in trials if t.user_attrs["kind"] == "duplicate"]
    assert sorted(t.params["gpus"] for t in launched) == [1, 2] and summary["n_trials"] == 2, log
    assert dups and summary["n_duplicates"] == len(dups)
    by_key = {config_key(t.user_attrs["params"]): t for t in launched}
    for t in dups:
        original = by_key[config_key(t.user_attrs["params"])]
        assert t.values == original.values and t.user_attrs["duplicate_of"] == original.number
    assert len(_started(cfg)) == 2, "a configuration ran twice"
    assert "study.max_rejected=6" in summary["stop_reason"]


@pytest.mark.parametrize("precheck", [True, False])
def test_a_configuration_predicted_oom_is_never_started(local_ray, tmp_path, precheck):
    # 28 GB per GPU fits one or two 32 GB cards, not three (a 24 GB card is then used)
    space = {"gpus": {"type": "categorical", "choices": [1, 3]},
             "gpu_memory_gb": {"type": "fixed", "value": 28.0}}
    cfg, space = fake_config(tmp_path, ["study.n_trials=2", f"study.precheck={str(precheck).lower()}", *FAST],
                             space=space, enqueue=[{"gpus": 3}])
    summary, log = run_study(cfg, space)
    t1 = _trials(cfg)[1]
    assert t1.params["gpus"] == 3
    if precheck:
        assert t1.user_attrs["kind"] == "rejected" and t1.user_attrs["reason"].startswith("predicted OOM"), log
        assert 1 not in _started(cfg) and not (tmp_path / "study" / "trials" / "0001").exists()
        assert summary["n_trials"] == 2 and summary["n_rejected"] >= 1
    else:
        assert t1.user_attrs["kind"] == "launched" and 1 in _started(cfg), log


def test_bo_never_proposes_what_the_driver_would_refuse_and_stops_when_all_ran(local_ray, tmp_path):
    """bo scores only launchable configurations: of 3 x 3 here, y=0.3 on two GPUs breaks a
    rule and gpus=3 is predicted OOM (28 GB each, a 24 GB card third), which leaves 5. A
    budget of 8 measures each once, refuses nothing, repeats nothing and says why it stopped."""
    space = {"x": {"type": "fixed", "value": 0.7},
             "y": {"type": "categorical", "choices": [0.3, 0.5, 0.7]},
             "gpus": {"type": "categorical", "choices": [1, 2, 3]},
             "gpu_memory_gb": {"type": "fixed", "value": 28.0}}
    cfg, space = _with_rules(fake_config(tmp_path, ["study.n_trials=8", "study.sampler=bo", *FAST],
                                         space=space), ["y >= 0.4 or gpus == 1"])
    summary, log = run_study(cfg, space)
    trials = _trials(cfg)
    assert [t.user_attrs["kind"] for t in trials] == ["launched"] * 5, log
    assert summary["n_trials"] == 5 and summary["n_rejected"] == 0 and summary["n_duplicates"] == 0
    ran = {(t.params["y"], t.params["gpus"]) for t in trials}
    assert ran == {(0.3, 1), (0.5, 1), (0.5, 2), (0.7, 1), (0.7, 2)}
    assert len(_started(cfg)) == 5
    assert "every launchable configuration was measured (5 of study.n_trials=8)" in summary["stop_reason"]


def test_resume_reruns_the_interrupted_configuration_without_spending_budget(local_ray, tmp_path):
    cfg, space = fake_config(tmp_path, ["study.n_trials=5", "space.duration_s.value=2.0", "ray.max_concurrent=1",
                                        "study.sampler=tpe", "study.early_stop=false"])  # every run whole
    cut = WhenStarted(cfg.engine.settings["record_dir"], lambda ev: ev["trial"] == "0002",
                      lambda ev: _thread.interrupt_main())
    cut.start()
    first, log = run_study(cfg, space)  # Ctrl-C while trial 2 runs
    cut.join()
    assert first["interrupted"] and first["n_trials"] == 2, log
    interrupted = _trials(cfg)[2]
    assert interrupted.user_attrs["kind"] == "interrupted"
    second, log = run_study(cfg, space)
    assert not second["interrupted"] and second["n_trials"] == 5, log
    trials = _trials(cfg)
    rerun = [t for t in trials if t.user_attrs.get("rerun_of") == 2]
    assert len(rerun) == 1 and rerun[0].params == interrupted.params
    assert rerun[0].user_attrs["kind"] == "launched" and rerun[0].user_attrs["status"] == "ok"
    launched = [t for t in trials if t.user_attrs["kind"] == "launched"]
    assert len(launched) == 5 and len({config_key(t.user_attrs["params"]) for t in launched}) == 5


def test_driver_state_is_typed(local_ray, tmp_path):
    cfg, space = fake_config(tmp_path, ["study.n_trials=1", *FAST])
    placement = Placement(cfg.ray)
    try:
        driver = Driver(cfg, space, placement, None, Reporter(cfg, Console(file=io.StringIO())))
        summary = driver.run()
    finally:
        placement.shutdown()
    assert isinstance(summary, StudySummary) and summary.n_trials == 1 and driver.pending == {}
    on_disk = json.loads((tmp_path / "study" / "summary.json").read_text())
    assert StudySummary.from_dict(on_disk).winner == summary.winner


def test_a_relative_bound_is_set_by_trial_0_which_runs_alone_and_a_resume_keeps_it(local_ray, tmp_path):
    """``ttft_p95_ms <= 1.1x baseline``: trial 0 (the engine's defaults) runs before anything else
    even with three slots, its TTFT sets the bound every trial is judged by, the summary says the
    number, and a resumed run keeps the bound instead of taking another trial's."""
    over = ["study.n_trials=5", "space.duration_s.value=0.3", "ray.max_concurrent=3",
            'constraints=["ttft_p95_ms <= 1.1x baseline"]']
    cfg, space = fake_config(tmp_path, over)
    summary, log = run_study(cfg, space)
    events = trial_events(cfg)
    others = [events[n]["start"]["time"] for n in events if n != 0]
    assert len(others) == 4 and min(others) >= events[0]["end"]["time"], "trial 0 ran alone"
    study = optuna.load_study(study_name=cfg.study.name, storage=cfg.storage_url)
    base = study.user_attrs["relative_baseline"]["ttft_p95_ms"]
    assert base[1] == 0 and base[0] == records(study)[0].metrics["ttft_p95_ms"]
    bound = 1.1 * base[0]
    assert f"ttft_p95_ms <= 1.1x baseline (= {bound:.4g})" in summary["constraints"]
    assert f"bounds relative to trial #0's measurement: ttft_p95_ms <= 1.1x baseline (= {bound:.4g})" in " ".join(log.split())
    for r in records(study):
        assert r.violations["ttft_p95_ms <= 1.1x baseline"] == pytest.approx(
            (r.metrics["ttft_p95_ms"] - bound) / bound), r.number
        if r.status == "ok":  # not one stopped early (it never reached trial 0's speed)
            assert r.feasible == (r.metrics["ttft_p95_ms"] <= bound), r.number

    cfg, space = fake_config(tmp_path, [*over[:-2], "study.n_trials=7", "ray.max_concurrent=3", over[-1]])
    summary, log = run_study(cfg, space)
    study = optuna.load_study(study_name=cfg.study.name, storage=cfg.storage_url)
    assert study.user_attrs["relative_baseline"]["ttft_p95_ms"] == base and "bounds relative" not in log
    later = [r for r in records(study) if r.number >= 5 and r.kind == "launched" and r.status != "failed"]
    assert later and all(r.violations["ttft_p95_ms <= 1.1x baseline"] == pytest.approx(
        (r.metrics["ttft_p95_ms"] - bound) / bound) for r in later)
