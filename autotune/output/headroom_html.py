"""The report's headroom: the roofline and energy verdict, and a serving study's load curve.

:func:`headroom_html` states how close the winner decodes to this box's memory-bandwidth
limit and its energy per token (or why either is unknown), from ``summary.json``;
:func:`prediction_html` how far the pre-launch predictions were from the measurements.
:func:`load_curve_figure` draws, for a study whose trials search the most load meeting an
SLO (``workload.load: slo``), TTFT p95 and goodput against the load level for the baseline,
the winner and the runner-up, from each trial's ``trials/NNNN/result.json`` (the levels the
SLO search measured: :mod:`autotune.measure.slo`): the SLO is a dashed line and the highest
level meeting it is ringed on each curve.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING

import plotly.graph_objects as go
from plotly.subplots import make_subplots

if TYPE_CHECKING:
    from autotune.measure.spec import WorkloadSpec
    from autotune.record.summary import StudySummary

HEADROOM_COLUMNS = ("roofline_pct", "energy_j_per_token")
COLORS = {"baseline": "#444", "winner": "#d4a000", "runner-up": "#1f77b4"}


def headroom_html(summary: StudySummary | None) -> str:
    """The "Headroom" section: the roofline verdict and energy per token, each a sentence."""
    h = summary.headroom if summary else None
    if h is None:
        return ""
    lines = [x for x in (h.roofline_words(), h.energy_words()) if x]
    return "<h2>Headroom</h2>" + "".join(
        f"<p id='headroom-{i}'>{html.escape(x[0].upper() + x[1:])}.</p>" for i, x in enumerate(lines))


def prediction_html(summary: StudySummary | None) -> str:
    """The "Predicted vs measured" section: how far the engine's pre-launch memory and decode
    predictions, and the user's ``predict.expect``, were from what the trials measured."""
    lines = summary.prediction.lines() if summary and summary.prediction else []
    return ("<h2>Predicted vs measured</h2>" + "".join(
        f"<p id='prediction-{i}'>{html.escape(x[0].upper() + x[1:])}.</p>" for i, x in enumerate(lines))
            if lines else "")


def search_levels(study_dir: Path, number: int) -> list[dict]:
    """The load levels trial ``number`` measured in its SLO search ([] without a record)."""
    try:
        data = json.loads((Path(study_dir) / "trials" / f"{number:04d}" / "result.json").read_text())
    except (OSError, ValueError):
        return []
    samples = data.get("samples") or (data.get("info") or {}).get("samples") or {}  # older: in info
    return list(samples.get("search") or [])


def _curves(study_dir: Path, summary: StudySummary) -> list[tuple[str, int, list[dict]]]:
    seen: set[int] = set()
    out = []
    for name, rec in (("baseline", summary.baseline), ("winner", summary.winner)):
        if rec is not None and rec.number not in seen:
            seen.add(rec.number)
            out.append((name if name != "winner" or rec.number != 0 else "winner = baseline", rec.number))
    if summary.runner_up is not None and summary.runner_up not in seen:
        out.append(("runner-up", summary.runner_up))
    return [(n, k, sorted(levels, key=lambda r: r["level"]))
            for n, k in out if (levels := search_levels(study_dir, k))]


def load_curve_figure(study_dir: Path, summary: StudySummary | None, wl: WorkloadSpec) -> go.Figure | None:
    """TTFT p95 and goodput against load for baseline, winner and runner-up (None unless the
    workload searches load levels and at least one of them kept its levels)."""
    if summary is None or wl.load != "slo":
        return None
    curves = _curves(study_dir, summary)
    if not curves:
        return None
    unit = "users" if wl.arrival == "closed" else "req/s"
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("TTFT p95 (ms)", "goodput (output tok/s meeting the SLO)"))
    for name, number, levels in curves:
        color = COLORS.get(name, COLORS["winner"])
        x = [r["level"] for r in levels]
        best = max((r["level"] for r in levels if r.get("meets_slo")), default=None)
        for col, key in ((1, "ttft_p95_ms"), (2, "goodput_tps")):
            fig.add_trace(go.Scatter(
                x=x, y=[r.get(key) for r in levels], mode="lines+markers", name=f"{name} #{number}",
                legendgroup=name, showlegend=col == 1, line={"color": color}), row=1, col=col)
            if best is not None:
                at = next(r for r in levels if r["level"] == best)
                fig.add_trace(go.Scatter(
                    x=[best], y=[at.get(key)], mode="markers", legendgroup=name, showlegend=False,
                    hovertext=f"{name}: max {best:g} {unit} at the SLO",
                    marker={"symbol": "circle-open", "size": 16, "color": color, "line": {"width": 2}}),
                    row=1, col=col)
    if wl.slo.ttft_p95_ms is not None:
        fig.add_hline(y=wl.slo.ttft_p95_ms, line_dash="dash", line_color="#c00", row=1, col=1,
                      annotation_text=f"SLO {wl.slo.ttft_p95_ms:g} ms", annotation_position="top left")
    fig.update_xaxes(title_text=unit, dtick=1 if wl.arrival == "closed" and max(
        r["level"] for _, _, levels in curves for r in levels) <= 16 else None)  # whole users
    fig.update_layout(title="Load curve: rings mark the most load meeting the SLO on each curve",
                      legend={"orientation": "h", "yanchor": "top", "y": -0.2, "x": 0})
    return fig
