"""The end-of-study re-measurement: when the baseline wins, when a candidate breaks a constraint
re-measured, and when a trial broke a tail-latency bound by one slow request (real studies,
in-process), and which trials count as such (a table)."""

from __future__ import annotations

import html
import io
import json

import pytest
from autotune.objectives.goals import Constraint
from rich.console import Console

from autotune.config.compose import compose
from autotune.config.schema import load_config
from autotune.output.report import Reporter
from autotune.run.finish import unmet
from autotune.run.remeasure import REMEASURE_BASE
from autotune.run.remeasure import choose_winner
from autotune.run.remeasure import tail_spikes
from autotune.search.trials import Record
from autotune.trial.spec import TrialResult
from tests.conftest import ROOT
from tests.conftest import study_overrides
from tests.helpers.cli import run_cli_here

TTFT = Constraint("ttft_p95_ms", "<=", 300.0)
E2E = Constraint("e2e_p99_ms", "<=", 5000.0)
PPL = Constraint("ppl_delta_pct", "<=", 2.0)
SPEED = Constraint("decode_tps", ">=", 20.0)


def _rec(status: str = "ok", **metrics: float) -> Record:
    cons = [TTFT, E2E, PPL, SPEED]
    violations = {str(c): c.violation(metrics[c.metric]) / abs(c.bound) for c in cons if c.metric in metrics}
    return Record(0, {}, metrics, status=status, feasible=status == "ok" and all(v <= 0 for v in violations.values()),
                  violations=violations)


@pytest.mark.parametrize(("rec", "spiked"), [
    (_rec(ttft_p50_ms=164, ttft_p95_ms=1745), True),  # today's trial 0: one slow request of five
    (_rec(ttft_p50_ms=280, ttft_p95_ms=310), False),  # a steady tail just over the bound
    (_rec(ttft_p50_ms=200, ttft_p95_ms=390), False),  # over, but under twice its median
    (_rec(ttft_p50_ms=400, ttft_p95_ms=2000), False),  # the median breaks the bound too: slow
    (_rec(ttft_p95_ms=2000), False),  # no median to compare with
    (_rec(ttft_p50_ms=100, ttft_p95_ms=2000, ppl_delta_pct=5), False),  # quality broke as well
    (_rec(ttft_p50_ms=100, ttft_p95_ms=2000, decode_tps=5), False),  # and a lower bound
    (_rec(ttft_p50_ms=100, ttft_p95_ms=250), False),  # feasible: nothing to rescue
    (_rec("failed", ttft_p50_ms=100, ttft_p95_ms=2000), False),  # did not run
    (_rec(e2e_p50_ms=1000, e2e_p99_ms=9000, ttft_p50_ms=100, ttft_p95_ms=120), True),  # p99 too
], ids=["spike", "steady-tail", "under-2x", "slow-median", "no-median", "quality-too",
        "lower-bound-too", "feasible", "failed", "p99"])
def test_tail_spikes_are_one_slow_request_not_a_slow_configuration(rec, spiked):
    assert tail_spikes([rec], [TTFT, E2E, PPL, SPEED]) == ([rec] if spiked else [])


@pytest.mark.slow
@pytest.mark.parametrize("spike", ["transient", "persistent"])
def test_a_trial_broken_by_one_slow_request_is_re_measured_and_wins_if_it_holds(tmp_path, spike):
    """k = 3 is the fastest, but its search-time TTFT p95 (2,000 ms, median 100, bound 300)
    made it infeasible. It ranks above the top-2 feasible candidates, so it is re-measured with
    them: steady re-runs make it the winner, slow ones drop it with the reason."""
    args = ["run", "--config-dir", str(ROOT / "tests" / "configs" / "good"), "conf=command_spike",
            f"engine.settings.vars.spike={spike}", "tracking.enabled=false", "report.enabled=true",
            *study_overrides(tmp_path, "spike")]
    proc = run_cli_here(args, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "studies" / "spike" / "summary.json").read_text())
    by_trial = summary["remeasured"]["by_trial"]
    assert sorted(by_trial) == ["0", "1", "2", "3"], by_trial  # top 2 (#2, #1), the spiked #3, the baseline
    assert "trial #3 broke ttft_p95_ms <= 300 (measured 2000), a spike over its median" in proc.stdout
    if spike == "transient":
        assert summary["winner"]["number"] == 3 and summary["winner"]["params"] == {"k": 3}
        assert summary["winner"]["feasible"] and summary["winner"]["metrics"]["ttft_p95_ms"] == 110.0
        assert "dropped" not in by_trial["3"] and summary["runner_up"] == 2
        page = (tmp_path / "studies" / "spike" / "report" / "report.html").read_text()
        assert ("Trial #3 broke ttft_p95_ms &lt;= 300 (measured 2000) when the search measured it; "
                "re-measured side by side, it meets every constraint.") in page
        best = (tmp_path / "studies" / "spike" / "best.yaml").read_text()
        assert "Winner of study spike: trial 3." in best and "value: 3" in best, best
    else:
        assert summary["winner"]["number"] == 2, summary["winner"]
        assert by_trial["3"]["dropped"] == "broke ttft_p95_ms <= 300 (measured 2000)", by_trial
        page = (tmp_path / "studies" / "spike" / "report" / "report.html").read_text()
        assert "when the search measured it" not in page


@pytest.mark.slow
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


@pytest.mark.slow
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


# The default study's re-measurement of 2026-11: three runs of five requests each. The runs'
# values (each run's median) rank #7 first (median of runs 64.23 vs 63.40); the 15 pooled
# samples, which the table, the CI and "within noise" use, put #13 ahead (65.01 vs 62.54).
RUNS = {
    7: [[60.0, 61.0, 64.98, 70.0, 71.0], [59.0, 59.5, 60.13, 62.54, 63.0], [58.0, 58.5, 64.23, 64.5, 65.0]],
    13: [[64.0, 67.0, 67.67, 68.0, 69.0], [58.0, 59.0, 59.89, 65.01, 66.0], [61.0, 62.0, 63.40, 65.5, 66.5]],
    0: [[46.0, 47.0, 47.5, 48.0, 49.0]] * 3,
}


class ReplayLauncher:
    """A fake launcher (the trial processes cannot be made to measure given numbers): it
    returns the recorded runs above, one per call, as a real re-measurement run reports them
    (each run's ``decode_tps`` is the median of its requests, its samples in ``info``)."""

    def __init__(self) -> None:
        self.calls: dict[int, int] = {}

    def run_now(self, number: int, params: dict, quality: bool = True, tag: str = "") -> TrialResult:
        trial = (number - REMEASURE_BASE) // 100
        rep = self.calls.get(trial, 0)
        self.calls[trial] = rep + 1
        samples = RUNS[trial][rep]
        return TrialResult(number, "ok", {"decode_tps": sorted(samples)[2], "ttft_p95_ms": 100.0},
                           samples={"decode_tps": samples})


def test_the_winner_is_ranked_on_the_pooled_median_the_table_shows():
    """Issue 43: the verdict crowned #7 while the table beside it showed #13 faster."""
    cfg = load_config(compose(["conf=local_cpu", "select.top_k=2", "select.rerun_repeats=3"]))
    recs = [Record(n, {"n": n}, {"decode_tps": v, "ttft_p95_ms": 100.0, "ppl_delta_pct": 0.0})
            for n, v in ((7, 66.0), (13, 65.0), (0, 47.0))]
    out = io.StringIO()
    verdict = choose_winner(cfg, ReplayLauncher(), Reporter(cfg, Console(file=out)), recs[:2], recs[2])
    table = verdict.remeasured
    assert table.row(7).median == 62.54 and table.row(13).median == 65.01, table
    assert verdict.winner.number == 13 and verdict.runner_up == 7
    assert verdict.winner.metrics["decode_tps"] == table.row(13).median  # what the summary's table shows
    assert verdict.speedup == pytest.approx(65.01 / 47.5)


def test_a_study_with_no_feasible_trial_names_the_bound_every_trial_broke():
    """On a box slower than the preset assumed (session 28: every trial of the default study over
    its absolute TTFT bound), the verdict's note says which bound to loosen and how close the
    search came; a bound some trial met is not named."""
    cfg = load_config(compose(["conf=local_cpu", 'constraints=["ppl_delta_pct <= 2", "ttft_p95_ms <= 300"]']))
    ttft, ppl = "ttft_p95_ms <= 300", "ppl_delta_pct <= 2"
    recs = [Record(0, {}, {"ttft_p95_ms": 457.0, "ppl_delta_pct": 0.0}, "ok", False, violations={ttft: 0.52, ppl: -1.0}),
            Record(2, {}, {"ttft_p95_ms": 328.4}, "stopped", False, violations={ttft: 0.095, ppl: 0.0}),
            Record(7, {}, {"ttft_p95_ms": 301.2, "ppl_delta_pct": 32.4}, "ok", False,
                   violations={ttft: 0.004, ppl: 15.2})]
    assert unmet(cfg, recs) == ("every measured trial broke ttft_p95_ms <= 300 (the closest: 301.2, trial #7); "
                                "loosen it to tune on this box")
    assert unmet(cfg, recs[1:]) == ("every measured trial broke ppl_delta_pct <= 2 (the closest: 32.4, trial #7); "
                                    "every measured trial broke ttft_p95_ms <= 300 (the closest: 301.2, trial #7); "
                                    "loosen them to tune on this box")
    assert unmet(cfg, []) == ""


def test_a_study_whose_trials_each_broke_a_different_bound_says_how_many_broke_each():
    """Session 28's second slow-box run: some trials broke only the perplexity bound, the others
    only the TTFT bound, so no bound was broken by all; the note still counts each."""
    cfg = load_config(compose(["conf=local_cpu", 'constraints=["ppl_delta_pct <= 2", "ttft_p95_ms <= 300"]']))
    ttft, ppl = "ttft_p95_ms <= 300", "ppl_delta_pct <= 2"
    recs = [Record(0, {}, {"ttft_p95_ms": 457.0, "ppl_delta_pct": 0.0}, "ok", False, violations={ttft: 0.52, ppl: -1.0}),
            Record(3, {}, {"ttft_p95_ms": 290.0, "ppl_delta_pct": 9.1}, "ok", False, violations={ttft: -0.03, ppl: 3.5}),
            Record(5, {}, {}, "failed", False, violations={ttft: 1.0, ppl: 1.0}),
            Record(7, {}, {"ttft_p95_ms": 330.0}, "stopped", False, violations={ttft: 0.1, ppl: 0.0})]
    assert unmet(cfg, recs) == ("no measured trial met every bound, though each bound was met by some: "
                                "ppl_delta_pct <= 2 broken by 1 of 3, ttft_p95_ms <= 300 broken by 2 of 3; "
                                "loosen one of them (or widen the space) to tune on this box")
