"""Typed summary records: JSON round trip (summary.json's form) and the prediction error."""

from __future__ import annotations

import json

import pytest

from autotune.record.records import Record
from autotune.record.summary import PredictionError
from autotune.record.summary import StudySummary
from autotune.record.summary import Verdict
from autotune.record.summary import prediction_error

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
    rows = [({"need_gb": [0.5], "decode_tps_upper": 100.0}, {"peak_rss_mb": 1024.0, "decode_tps": 80.0}),
            ({"need_gb": [2.0, 2.0], "decode_tps_upper": 50.0}, {"vram_peak_gb": 5.0, "decode_tps": 60.0}),
            ({"decode_tps_upper": None}, {"decode_tps": 1.0})]
    err = prediction_error(rows)
    assert err.n_memory == 2 and err.memory_error_pct_median == pytest.approx(35.0)
    assert err.memory_error_pct_max == pytest.approx(50.0)
    assert err.n_speed == 2 and err.speed_ratio_median == pytest.approx(1.0)
    assert err.speed_over_bound == 1  # 60 tok/s measured over a 50 tok/s "upper bound"
    assert prediction_error([({}, {"decode_tps": 1.0})]) is None
