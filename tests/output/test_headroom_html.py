"""The report's headroom section and a serving study's load curve, from files as a study writes them."""

from __future__ import annotations

import json
from pathlib import Path

from autotune.measure.spec import SLOSpec
from autotune.measure.spec import WorkloadSpec
from autotune.output.headroom_html import headroom_html
from autotune.output.headroom_html import load_curve_figure
from autotune.output.headroom_html import prediction_html
from autotune.record.summary import Headroom
from autotune.record.summary import PredictionError
from autotune.record.summary import StudySummary
from autotune.search.trials import Record

SLO = WorkloadSpec(load="slo", slo=SLOSpec(ttft_p95_ms=2000))


def _trial(study: Path, number: int, levels: list[tuple[float, float, float, bool]]) -> None:
    """A trial's result.json holding the levels its SLO search measured: (users, ttft p95, goodput, meets)."""
    rows = [{"level": u, "ttft_p95_ms": t, "goodput_tps": g, "meets_slo": ok} for u, t, g, ok in levels]
    d = study / "trials" / f"{number:04d}"
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({"number": number, "status": "ok",
                                               "info": {"samples": {"search": rows}}}))


def _summary(**kw) -> StudySummary:
    rec = {n: Record(n, {}, {}, "ok", True) for n in (0, 3, 5)}
    return StudySummary(study="s", engine="llama_server", interrupted=False, baseline=rec[0],
                        winner=rec[kw.pop("winner", 3)], **kw)


def test_the_load_curve_draws_baseline_winner_and_runner_up_with_the_slo(tmp_path):
    _trial(tmp_path, 0, [(4, 2500, 0, False), (1, 300, 40, True), (2, 900, 70, True), (3, 2100, 0, False)])
    _trial(tmp_path, 3, [(1, 200, 45, True), (2, 500, 85, True), (4, 1500, 150, True), (8, 2600, 0, False)])
    _trial(tmp_path, 5, [(1, 250, 44, True), (2, 700, 80, True), (4, 2300, 0, False)])
    fig = load_curve_figure(tmp_path, _summary(runner_up=5), SLO)
    lines = {t.name: t for t in fig.data if t.mode == "lines+markers" and t.xaxis == "x"}
    assert sorted(lines) == ["baseline #0", "runner-up #5", "winner #3"]
    assert list(lines["baseline #0"].x) == [1, 2, 3, 4]  # in order of load, not of measurement
    assert list(lines["winner #3"].y) == [200, 500, 1500, 2600]
    rings = [(t.x[0], t.y[0]) for t in fig.data if t.mode == "markers" and t.xaxis == "x2"]
    assert sorted(rings) == [(2, 70), (2, 80), (4, 150)]  # the most users meeting the SLO, on goodput
    slo = [s for s in fig.layout.shapes if s.y0 == 2000 and s.y1 == 2000]
    assert len(slo) == 1 and slo[0].line.dash == "dash"


def test_no_curve_without_levels(tmp_path):
    assert load_curve_figure(tmp_path, _summary(), SLO) is None  # no result.json kept
    _trial(tmp_path, 3, [(1, 200, 45, True)])
    assert load_curve_figure(tmp_path, _summary(), WorkloadSpec()) is None  # a fixed-load study
    fig = load_curve_figure(tmp_path, _summary(winner=0), SLO)  # the winner is the baseline: #3 has none
    assert fig is None


def test_the_headroom_section_says_the_share_or_why_not():
    h = Headroom(48.2, 100.0, 250.0, "RAM 20.0 GB/s (read probe)", energy_note="no energy counter readable here: x")
    page = headroom_html(_summary(headroom=h))
    assert "The winner runs at 48% of this box&#x27;s memory-bandwidth limit" in page
    assert "No energy counter readable here: x." in page
    assert headroom_html(None) == "" and headroom_html(_summary()) == ""


def test_the_page_says_how_far_the_predictions_were_from_the_measurements():
    """The console's prediction lines, on the page: only what was predicted and measured."""
    err = PredictionError(n_memory=5, memory_error_pct_median=3.2, memory_error_pct_max=9.0, n_expect=4,
                          expect_off_median={"ppl_delta_pct": -0.3})
    page = prediction_html(_summary(prediction=err))
    assert page.startswith("<h2>Predicted vs measured</h2>")
    assert "<p id='prediction-0'>Prediction vs measured: memory error median 3.2% (n=5).</p>" in page
    assert "decode" not in page  # no decode bound was predicted
    assert "Expected vs measured (predict.expect): ppl_delta_pct measured -0.3 from what was expected, " \
           "median over 4 trials." in page
    assert prediction_html(None) == "" and prediction_html(_summary()) == ""
