"""Typed summary records: JSON round trip (summary.json's form) and the prediction error."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from autotune.engines.predict import Prediction
from autotune.output.report import render_summary
from autotune.record.summary import PredictionError
from autotune.record.summary import Remeasured
from autotune.record.summary import StudySummary
from autotune.record.summary import Verdict
from autotune.record.summary import prediction_error
from autotune.search.trials import Record

BASE = Record(0, {"n_threads": 1}, {"decode_tps": 70.0}, violations={"run_ok": 0.0})
WIN = Record(4, {"n_threads": 2}, {"decode_tps": 90.0}, violations={"run_ok": 0.0})


def test_summary_round_trips_through_json():
    s = StudySummary(study="s", engine="llamacpp", interrupted=False, n_trials=16, n_rejected=3,
                     baseline=BASE, winner=WIN, pareto=[0, 4], speedup=1.29, speedup_within_noise=False,
                     prediction=PredictionError(n_speed=2, speed_ratio_median=0.5))
    data = json.loads(json.dumps(s.to_dict()))
    assert data["winner"]["params"] == {"n_threads": 2} and data["n_rejected"] == 3
    assert "note" not in data and "runner_up" not in data  # unknown verdict keys stay out, as before
    assert StudySummary.from_dict(data) == s


def test_verdict_round_trips():
    v = Verdict(winner=WIN, baseline_remeasured=BASE, lead_within_noise=True, runner_up=0)
    assert Verdict.from_dict(json.loads(json.dumps(v.to_dict()))) == v
    assert Verdict().winner is None


def test_prediction_error_against_measurements():
    rows = [(Prediction(need_gb=(0.5,), decode_tps_upper=100.0), {"peak_rss_mb": 1024.0, "decode_tps": 80.0}),
            (Prediction(need_gb=(2.0, 2.0), decode_tps_upper=50.0), {"vram_peak_gb": 5.0, "decode_tps": 60.0}),
            (Prediction(decode_tps_upper=None), {"decode_tps": 1.0})]
    err = prediction_error(rows)
    assert err.n_memory == 2 and err.memory_error_pct_median == pytest.approx(35.0)
    assert err.memory_error_pct_max == pytest.approx(50.0)
    assert err.n_speed == 2 and err.speed_ratio_median == pytest.approx(1.0)
    assert err.speed_over_bound == 1  # 60 tok/s measured over a 50 tok/s "upper bound"
    assert prediction_error([(Prediction(), {"decode_tps": 1.0})]) is None


def test_an_expected_metric_is_compared_with_what_was_measured_and_kept_with_the_trial():
    """``predict.expect`` (issue 41): the summary says how far the user's table was off, and a
    launched trial keeps what was expected of it (its stored prediction)."""
    table = [Prediction(expect=(("ppl_delta_pct", 2.81),)), Prediction(expect=(("ppl_delta_pct", 0.35),)),
             Prediction(expect=(("ppl_delta_pct", 0.91),))]
    kept = [Prediction.from_stored(json.loads(json.dumps(p.stored()))) for p in table]
    assert kept == table and Prediction().stored() is None
    assert "expect" not in Prediction(decode_tps_upper=9.0).stored()  # what older studies stored, unchanged
    measured = [{"ppl_delta_pct": 2.25}, {"ppl_delta_pct": 0.28}, {"decode_tps": 5.0}]  # the third broke down
    err = prediction_error(list(zip(kept, measured)))
    assert err.n_memory == err.n_speed == 0 and err.n_expect == 2
    assert err.expect_off_median == {"ppl_delta_pct": pytest.approx(-0.315)}  # median of -0.56 and -0.07
    s = StudySummary(study="s", engine="command", interrupted=False, n_trials=3, prediction=err)
    assert StudySummary.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    console = Console(file=io.StringIO(), width=200)
    render_summary(console, s, "decode_tps", [])
    out = console.file.getvalue()
    assert "expected vs measured (predict.expect): ppl_delta_pct measured -0.315 from what was expected, median " \
           "over 2 trials" in out and "memory error" not in out


@pytest.mark.parametrize("n_win, n_base, within, words", [
    (3, 3, True, "within noise"),
    (3, 3, False, "outside noise"),
    (1, 3, True, "not judged: 1 re-measured sample on a side; raise select.rerun_repeats"),
    (1, 1, False, "outside noise"),  # a verdict of "outside" already needs spread on both sides
    (3, 3, None, None),
])
def test_a_noise_verdict_on_one_sample_reads_not_judged(n_win, n_base, within, words):
    rem = Remeasured.from_dict({"metric": "decode_tps",
                                "by_trial": {4: {"median": 90.0, "ci95": [90.0, 90.0], "n": n_win},
                                             0: {"median": 40.0, "ci95": [40.0, 40.0], "n": n_base}}})
    s = StudySummary(study="s", engine="command", interrupted=False, baseline=BASE, winner=WIN,
                     remeasured=rem, speedup=2.25, speedup_within_noise=within)
    assert s.noise_words(within, 4, 0) == words
    # summary.json keys trials as strings: the same words once read back
    back = StudySummary.from_dict(json.loads(s.to_json()))
    assert back.noise_words(within, 4, 0) == words
