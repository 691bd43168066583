"""report.html's trials table says why each trial is not feasible, a broken constraint included."""

from __future__ import annotations

import html
import json

import optuna
import pytest

from autotune.config.schema import load_config
from autotune.config.validate import compile_space
from autotune.output.report_html import trials_table
from autotune.record import optuna_study as studylib
from autotune.search.trials import Record
from autotune.trial.spec import TrialResult


def _cfg():
    return load_config({
        "engine": {"kind": "command", "settings": {
            "argv": ["x", "{a}"], "knobs": {"a": {"type": "int", "low": 0, "high": 9}}, "defaults": {"a": 0}}},
        "space": {"a": {"type": "int", "low": 0, "high": 9}},
        "objectives": ["decode_tps"],
        "constraints": ["ttft_p95_ms <= 100", "decode_tps >= 5"],
        "quality": {"enabled": False},
    })


def test_the_reason_cell_names_each_broken_constraint_with_its_measured_value():
    cfg = _cfg()
    space = compile_space(cfg)
    study = optuna.create_study(directions=studylib.directions(cfg))
    told = [TrialResult(0, "ok", {"decode_tps": 12.0, "ttft_p95_ms": 80.0}),
            TrialResult(0, "ok", {"decode_tps": 3.0, "ttft_p95_ms": 150.0}),
            TrialResult(0, "failed", reason="llama_decode: failed to find a KV slot")]
    for result in told:
        trial = study.ask()
        params = space.suggest(trial)
        studylib.tell(study, trial, cfg, params, TrialResult(trial.number, result.status, result.metrics,
                                                             reason=result.reason))
    rows = trials_table(study, ["decode_tps", "ttft_p95_ms"]).split("<tr class=")[1:]
    cells = [r.split("<td>")[-1].split("</td>")[0] for r in rows]
    assert cells[0] == ""  # feasible: nothing broken
    assert cells[1] == "broke ttft_p95_ms &lt;= 100 (measured 150); decode_tps &gt;= 5 (measured 3)"
    assert cells[2] == "llama_decode: failed to find a KV slot"


def test_a_one_sample_verdict_reads_not_judged_in_both_reports():
    """A command engine re-measured once a side: no spread, so the lead is not judged (not
    "within noise" next to a 2.25x speed-up)."""
    import io

    from rich.console import Console

    from autotune.output.report import render_summary
    from autotune.output.report_html import verdict_html
    from autotune.record.summary import Remeasured
    from autotune.record.summary import StudySummary
    from autotune.search.trials import Record

    base = Record(0, {"a": 0}, {"decode_tps": 40.0}, violations={"run_ok": 0.0})
    win = Record(4, {"a": 7}, {"decode_tps": 90.0}, violations={"run_ok": 0.0})
    rem = Remeasured.from_dict({"metric": "decode_tps",
                                "by_trial": {"4": {"median": 90.0, "ci95": [90.0, 90.0], "n": 1},
                                             "0": {"median": 40.0, "ci95": [40.0, 40.0], "n": 1}}})
    s = StudySummary(study="s", engine="command", interrupted=False, n_trials=5, n_feasible=5, baseline=base,
                     winner=win, remeasured=rem, speedup=2.25, speedup_source="re-measured side by side",
                     speedup_within_noise=True, lead_within_noise=True, runner_up=0)
    out = io.StringIO()
    render_summary(Console(file=out, width=200), s, "decode_tps", [])
    text = out.getvalue()
    assert "2.25x" in text and "within noise" not in text
    assert text.count("not judged: 1 re-measured sample on a side; raise select.rerun_repeats") == 2
    page = verdict_html(s, [], "decode_tps")
    assert "within noise" not in page and page.count("not judged") == 2
    assert "dropped" not in page + text  # no candidate dropped: no column, no line


@pytest.mark.parametrize(("base", "words"), [
    (Record(0, {"a": 0}, {"decode_tps": 40.0, "ttft_p95_ms": 222.0}, feasible=False,
            violations={"ttft_p95_ms <= 200": 0.11, "run_ok": 0.0}),
     "the baseline (trial #0) broke ttft_p95_ms <= 200 (measured 222)"),
    (Record(0, {"a": 0}, {}, status="oom", feasible=False, reason="CUDA out of memory\n  at load",
            violations={"run_ok": 1.0}),
     "the baseline (trial #0) oom: CUDA out of memory at load"),
    (Record(0, {"a": 0}, {"decode_tps": 40.0, "ttft_p95_ms": 150.0}, violations={"run_ok": 0.0}), None),
])
def test_a_speedup_over_an_infeasible_baseline_says_so_in_both_reports(base, words):
    """A speed-up over a baseline that broke a constraint (or failed to run) is stated with
    why the baseline fails, in the console summary and report.html."""
    import io

    from rich.console import Console

    from autotune.output.report import render_summary
    from autotune.output.report_html import verdict_html
    from autotune.record.summary import StudySummary

    win = Record(4, {"a": 7}, {"decode_tps": 90.0, "ttft_p95_ms": 150.0}, violations={"run_ok": 0.0})
    s = StudySummary(study="s", engine="command", interrupted=False, n_trials=5, n_feasible=4, baseline=base,
                     winner=win, speedup=2.25 if base.status == "ok" else None, speedup_source="search")
    assert StudySummary.from_dict(json.loads(s.to_json())).baseline_words() == s.baseline_words() == words
    out = io.StringIO()
    render_summary(Console(file=out, width=200), s, "decode_tps", [])
    page = verdict_html(s, [], "decode_tps")
    if words is None:
        assert "does not meet your constraints" not in out.getvalue() + page
    else:
        assert f"{words}: it does not meet your constraints" in out.getvalue()
        assert html.escape(words) + ": it does not meet your constraints" in page


def test_the_pareto_plot_marks_an_infeasible_baseline():
    """Trial 0 broke a constraint: its star says "(infeasible)"; the feasible winner's does not."""
    from autotune.output.report_html import pareto_figure

    cfg = _cfg()
    space = compile_space(cfg)
    study = optuna.create_study(directions=studylib.directions(cfg))
    for metrics in ({"decode_tps": 8.0, "ttft_p95_ms": 150.0}, {"decode_tps": 12.0, "ttft_p95_ms": 80.0}):
        trial = study.ask()
        studylib.tell(study, trial, cfg, space.suggest(trial), TrialResult(trial.number, "ok", metrics))
    names = [tr.name for tr in pareto_figure(study, ["decode_tps", "ttft_p95_ms"], 1).data]
    assert "baseline #0 (infeasible)" in names and "winner #1" in names
    # the end-of-study re-measurement judged the baseline feasible (a TTFT spike the first
    # time): the legend says both, not the first verdict alone; agreeing verdicts add nothing
    names = [tr.name for tr in pareto_figure(study, ["decode_tps", "ttft_p95_ms"], 1, {0: True, 1: True}).data]
    assert "baseline #0 (infeasible when first measured, feasible re-measured)" in names and "winner #1" in names
    names = [tr.name for tr in pareto_figure(study, ["decode_tps", "ttft_p95_ms"], 1, {0: False}).data]
    assert "baseline #0 (infeasible)" in names
