"""The end-of-study re-measurement when the baseline wins (a real fake-engine study, in-process)."""

from __future__ import annotations

import html
import json

import pytest

from tests.conftest import study_overrides
from tests.helpers.cli import run_cli_here

pytestmark = pytest.mark.slow


def test_a_baseline_that_wins_is_neither_its_own_runner_up_nor_judged_against_itself(tmp_path):
    # one launched trial: the baseline is the top candidate and the baseline at once. The preset's
    # TTFT bound (25 ms against the fake's ~16 ms of real sleep) broke once on a loaded box, and an
    # infeasible baseline is no winner: this test is about the re-measurement, not the bound.
    args = ["run", "conf=fake_gpus", "study.n_trials=1", "select.top_k=1", "select.rerun_repeats=2",
            "report.enabled=false", "constraints=['ttft_p95_ms <= 1000']",
            *study_overrides(tmp_path, "solo", seed_mlflow=True)]
    proc = run_cli_here(args, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "studies" / "solo" / "summary.json").read_text())
    assert summary["winner"]["number"] == summary["baseline"]["number"] == 0
    assert summary["speedup"] == 1.0
    assert "runner_up" not in summary and "lead_within_noise" not in summary, summary
    assert "speedup_within_noise" not in summary, summary
    assert "lead over #0" not in proc.stdout and "No configuration beat the engine defaults" in proc.stdout


def test_a_candidate_that_breaks_a_constraint_when_re_measured_is_dropped_and_the_reports_say_why(tmp_path):
    """On the exl2_70b bench surface, candidate #5 measures a TTFT p95 of 190.6 ms in the search
    and 200.7 ms when re-measured (bound 200): it leaves the final ranking to #6, and
    summary.json, the console and report.html say why (before, the re-measure table showed its
    median beside the winner with no reason).

    The trials are enqueued, not searched: the simulator's noise is seeded by the
    configuration, the seed and the re-measure directory (which holds the trial number), so
    these figures hold on any machine, while a searched path can differ in the GP's last bits
    from one CPU to another (it once put this case at #11 instead of #9). #1-#4 are slow
    fillers that put the two candidates at #5 and #6."""
    from tests.conftest import ROOT

    fillers = "{max_seq_len: 4096}, {max_seq_len: 8192}, {max_seq_len: 12288}, {cache_mode: Q8}"
    candidates = ("{bpw: 4.0, cache_mode: Q8, gpu_split: tp, draft_k: 4, max_seq_len: 32768}, "
                  "{bpw: 3.5, cache_mode: Q8, gpu_split: tp, draft_k: 5, max_seq_len: 32768}")
    args = ["run", "--config-dir", str(ROOT / "bench" / "surfaces"), "conf=exl2_70b", "~engine.settings.predict",
            "study.n_trials=7", "study.n_startup=1", f"study.enqueue=[{fillers}, {candidates}]",
            "engine.settings.vars.noise_seed=1", "tracking.enabled=false", *study_overrides(tmp_path, "dropped")]
    proc = run_cli_here(args, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    study = tmp_path / "studies" / "dropped"
    summary = json.loads((study / "summary.json").read_text())
    by_trial = summary["remeasured"]["by_trial"]
    winner = str(summary["winner"]["number"])
    dropped = {n: v["dropped"] for n, v in by_trial.items() if "dropped" in v and n != "0"}
    assert dropped == {"5": "broke ttft_p95_ms <= 200 (measured 200.7)"} and winner == "6", by_trial
    assert "dropped" not in by_trial[winner]
    text = " ".join(proc.stdout.split())
    assert f"candidate #5 was dropped after its re-measurement: {dropped['5']}" in text
    page = (study / "report" / "report.html").read_text()
    assert "<th>dropped: its re-measured numbers</th>" in page and html.escape(dropped["5"]) in page
