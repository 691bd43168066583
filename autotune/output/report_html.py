"""``report.html`` and PNG plots of a study, from its Optuna storage and ``summary.json``.

The plots are Optuna's own (``optuna.visualization``: Pareto front, optimization history,
parameter importances) drawn on an in-memory copy of the study that holds only the
trials that were measured, so failed and rule-refused trials (told to Optuna with the worst
values, see :mod:`autotune.record.optuna_study`) do not appear as points. The winner and the baseline are
marked on the Pareto front. The page is self-contained (plotly.js inline) and also lists
every trial with its status and reason, the constraints and the noise verdict. PNGs are
written by kaleido (a headless Chromium) in a child process with a time limit
(:mod:`autotune.output.pngs`); without a browser, or past the limit, the PNGs are skipped with
a note and the HTML is still written.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import optuna
import plotly.graph_objects as go
from optuna.trial import TrialState

from autotune._files import write_atomic
from autotune.objectives import get_metric
from autotune.output.headroom_html import HEADROOM_COLUMNS
from autotune.output.headroom_html import headroom_html
from autotune.output.headroom_html import load_curve_figure
from autotune.output.headroom_html import prediction_html
from autotune.output.pngs import write_pngs
from autotune.record.optuna_study import copied_attrs
from autotune.record.study_dirs import constraints_as_written
from autotune.record.study_dirs import load_study
from autotune.record.study_dirs import read_config
from autotune.record.study_dirs import read_summary
from autotune.search.trials import broken_text
from autotune.search.trials import trial_attrs

if TYPE_CHECKING:
    from autotune.config.schema import Config
    from autotune.record.optuna_study import TrialAttrs
    from autotune.record.summary import StudySummary

FIG_W, FIG_H = 900, 520


def _label(metric: str) -> str:
    unit = get_metric(metric).unit
    return f"{metric} ({unit})" if unit else metric


def _measured(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if trial_attrs(t).status == "ok"]


def _feasible(t: optuna.trial.FrozenTrial) -> bool:
    return all(v <= 0 for v in (getattr(t, "constraints", None) or {}).values())


def _copy(study: optuna.Study, metrics: list[str]) -> tuple[optuna.Study, list[int]]:
    """In-memory study whose values are ``metrics`` (from the trials' measured metrics).

    Measured trials with a finite value for every metric are copied with their parameters
    and constraints (so Optuna's plots tell feasible from infeasible); every other trial
    becomes a FAIL placeholder, which Optuna's plots skip, so trial numbers stay the study's.
    Returns the copy and the numbers of the copied trials.
    """
    mem = optuna.create_study(directions=[get_metric(m).direction for m in metrics])
    measured = {t.number: t for t in _measured(study)}
    numbers = []
    for number in range(max((t.number for t in study.get_trials(deepcopy=False)), default=-1) + 1):
        t = measured.get(number)
        m = trial_attrs(t).metrics if t else {}
        if t is not None and all(math.isfinite(m.get(k, math.nan)) for k in metrics):
            mem.add_trial(optuna.trial.create_trial(
                values=[m[k] for k in metrics], params=t.params, distributions=t.distributions,
                user_attrs=copied_attrs(t), constraints=dict(getattr(t, "constraints", None) or {})))
            numbers.append(number)
        else:
            mem.add_trial(optuna.trial.create_trial(state=TrialState.FAIL))
    return mem, numbers


def _star_label(name: str, number: int, first: bool, judged: bool | None) -> str:
    """A star's legend: ``name #number``, and what broke, when it did. ``first``: whether the
    trial met the constraints when the search measured it; ``judged``: whether it met them
    after the end-of-study re-measurement (None: not re-measured)."""
    label = f"{name} #{number}"
    if judged is None or judged == first:
        return label + ("" if first else " (infeasible)")
    return label + (" (infeasible when first measured, feasible re-measured)" if judged
                    else " (feasible when first measured, infeasible re-measured)")


def pareto_figure(study: optuna.Study, objectives: list[str], winner: int | None,
                  judged: dict[int, bool] | None = None) -> go.Figure | None:
    """Optuna's Pareto front of the measured trials, winner and baseline starred. ``judged``:
    trial number -> feasible after the end-of-study re-measurement (summary.json), which a
    star's legend gives when it differs from the search's own measurement."""
    if len(objectives) < 2:
        return None
    mem, numbers = _copy(study, objectives[:2])
    if not numbers:
        return None
    fig = optuna.visualization.plot_pareto_front(mem, target_names=[_label(o) for o in objectives[:2]])
    # Optuna colours the front by trial number with a colour bar that means nothing here
    fig.update_traces(marker_showscale=False, selector={"type": "scatter"})
    by_number = {t.number: t for t in mem.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE}
    marks = [(winner, "winner = baseline" if winner == 0 else "winner", "gold")]
    if winner != 0:
        marks.insert(0, (0, "baseline", "#444"))
    for number, name, color in marks:
        t = by_number.get(number) if number is not None else None
        if t is not None:
            # the star hides the grey fill that marks an infeasible point, so the legend says it
            # (the text beside the star stays short: a long one runs off the plot)
            label = _star_label(name, number, _feasible(t), (judged or {}).get(number))
            fig.add_trace(go.Scatter(
                x=[t.values[0]], y=[t.values[1]], mode="markers+text", name=label, text=[f"{name} #{number}"],
                textposition="top center", cliponaxis=False,
                marker={"symbol": "star", "size": 18, "color": color, "line": {"width": 1, "color": "black"}}))
    fig.update_layout(title="Pareto front of the measured trials (stars: winner, baseline = trial 0)",
                      legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0})
    return fig


def history_figure(study: optuna.Study, metric: str) -> go.Figure | None:
    """Optuna's optimization history of the selection metric: best feasible value so far."""
    mem, numbers = _copy(study, [metric])
    if not numbers:
        return None
    fig = optuna.visualization.plot_optimization_history(mem, target_name=_label(metric))
    fig.update_layout(title=f"{metric}: every measured trial and the best feasible so far",
                      xaxis_title="trial")
    fig.update_xaxes(dtick=max(1, math.ceil(len(mem.trials) / 20)))  # whole trial numbers
    return fig


def importance_figure(study: optuna.Study, metric: str) -> go.Figure | None:
    """Optuna's parameter importances (fANOVA) for the selection metric over measured trials."""
    mem, numbers = _copy(study, [metric])
    if len(numbers) < 3:
        return None
    try:
        fig = optuna.visualization.plot_param_importances(mem, target_name=_label(metric))
    except (ValueError, RuntimeError):  # too few distinct values to fit importances
        return None
    fig.update_layout(title=f"Which knob mattered for {metric} (fANOVA importance)")
    return fig


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "-" if not math.isfinite(v) else f"{v:.4g}"
    return html.escape("-" if v is None else str(v))


def _duration(a: TrialAttrs) -> str:
    """A trial's wall-clock and, in its tooltip, its phases ("-" for one never launched)."""
    if not a.duration_s:
        return "-"
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in a.times_s.items())
    return f"<span title='{html.escape(parts)}'>{a.duration_s:.1f}</span>" if parts else f"{a.duration_s:.1f}"


def _reason(t: optuna.trial.FrozenTrial, a: TrialAttrs) -> str:
    """Why a trial failed or broke a bound, and where its quality numbers came from."""
    why = a.reason or broken_text(dict(t.constraints or {}), a.metrics)
    reused = f"quality reused from trial #{a.quality_from}" if a.quality_from is not None else ""
    return "; ".join(x for x in (why, reused) if x)


def trials_table(study: optuna.Study, metrics: list[str]) -> str:
    """Every trial: number, status, feasible, reason, the main metrics and the parameters."""
    head = ["#", "status", "feasible", *[_label(m) for m in metrics], "time (s)", "parameters", "reason"]
    rows = []
    for t in study.get_trials(deepcopy=False):
        a = trial_attrs(t)
        status = a.status or ("running" if t.state == TrialState.RUNNING else t.state.name.lower())
        ok = status == "ok" and t.state == TrialState.COMPLETE and _feasible(t)
        params = a.params or t.params
        cells = [str(t.number), status, "yes" if ok else "no", *[_cell(a.metrics.get(k)) for k in metrics],
                 _duration(a),
                 _cell(" ".join(f"{k}={v}" for k, v in params.items())), _cell(_reason(t, a))]
        rows.append(f"<tr class='{html.escape(status)}'>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return ("<table id='trials'><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + "\n".join(rows) + "</tbody></table>")


def verdict_html(summary: StudySummary | None, constraints: list[str], metric: str, first_broken: str = "") -> str:
    """Constraints, speed-up and noise verdicts from summary.json. ``first_broken``: what the
    winner broke when the search measured it, when its re-measured numbers hold (the
    re-measurement re-admits a trial broken by one slow request: autotune.run.remeasure)."""
    cons = "".join(f"<li><code>{html.escape(c)}</code></li>" for c in constraints) or "<li>none</li>"
    out = [f"<h2>Constraints</h2><ul>{cons}</ul>", "<h2>Verdict</h2>"]
    if summary is None:
        return "".join(out) + "<p>The study has not ended: no re-measurement or noise verdict yet.</p>"
    if summary.interrupted:
        out.append("<p class='warn'>The study was interrupted: the winner comes from the search, not "
                   "re-measured.</p>")
    win, base = summary.winner, summary.baseline
    if win is None:
        out.append(f"<p>No feasible configuration. {html.escape(summary.note or '')}</p>")
    else:
        sp = summary.speedup
        noise = summary.speedup_within_noise
        words = summary.noise_words(noise, win.number, base.number if base else None) or ""
        out.append(f"<p>Winner: trial <b>#{win.number}</b>" + (f", baseline trial #{base.number}" if base else "")
                   + (f"; speed-up in {html.escape(metric)}: <b>{sp:.2f}x</b> ({html.escape(str(summary.speedup_source or ''))})"
                      if sp is not None else "")
                   + (f"; <span class='warn'>{html.escape(words)}</span>" if noise else ("; outside noise" if noise is False else ""))
                   + "</p>")
        if first_broken:
            out.append(f"<p>Trial #{win.number} {html.escape(first_broken)} when the search measured it; "
                       "re-measured side by side, it meets every constraint.</p>")
        if bad_base := summary.baseline_words():
            out.append(f"<p class='warn'>{html.escape(bad_base)}: it does not meet your constraints.</p>")
        if summary.lead_within_noise is not None:
            out.append(f"<p>Lead over the runner-up #{summary.runner_up}: "
                       + (f"<span class='warn'>{html.escape(summary.noise_words(True, win.number, summary.runner_up) or '')}</span>"
                          if summary.lead_within_noise else "outside noise")
                       + " (bootstrap 95% CI of the difference of medians).</p>")
    if summary.remeasured:
        better = 1.0 if get_metric(summary.remeasured_metric).higher_is_better else -1.0
        # best median first (the statistic the verdict ranks by), the dropped ones last
        remeasured = sorted(summary.remeasured_rows(), key=lambda r: (bool(r.dropped), -better * r.median))
        why = any(r.dropped for r in remeasured)  # a column only when a candidate was dropped
        rows = "".join(f"<tr><td>#{r.trial}</td><td>{_cell(r.median)}</td><td>{_cell(r.ci95[0])} - {_cell(r.ci95[1])}"
                       f"</td><td>{r.n}</td>" + (f"<td class='warn'>{_cell(r.dropped)}</td>" if why else "") + "</tr>"
                       for r in remeasured)
        out.append(f"<p>Re-measured side by side ({html.escape(_label(summary.remeasured_metric))}):</p><table><tr>"
                   f"<th>trial</th><th>median</th><th>95% CI</th><th>samples</th>"
                   + ("<th>dropped: its re-measured numbers</th>" if why else "") + f"</tr>{rows}</table>")
    for w in summary.warnings or []:
        out.append(f"<p class='warn'>warning: {html.escape(w)}</p>")
    return "".join(out)


CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}
tr.failed td,tr.timeout td{background:#fde8e8}tr.infeasible td{background:#fff6dd}.warn{color:#a15c00}
.plot{margin:1em 0}.missing{color:#777;font-style:italic}"""


def write_report(path: Path, out: Path, png: bool = True) -> list[Path]:
    """Write ``report.html`` (and ``<plot>.png`` files) for the study stored in ``path``, from its
    ``config.yaml``, Optuna storage and ``summary.json`` (``autotune report``); returns them."""
    config = read_config(path)
    return render_report(config, load_study(path, config), read_summary(path), path, out, png)


def render_report(config: Config, study: optuna.Study, summary: StudySummary | None, path: Path,
                  out: Path, png: bool = True) -> list[Path]:
    """Write the report of ``study`` from its config and summary as given (in memory at the end
    of a run); ``path``: the study directory (each trial's ``result.json`` for the load curve)."""
    import plotly.offline

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # "no feasible trials" is in the page
    objectives = [o.metric for o in config.objectives]
    metric = config.select.metric
    winner = summary.winner if summary else None
    judged = {r.number: r.feasible for r in (summary.baseline, winner) if r is not None} if summary else {}
    first = next((t for t in study.get_trials(deepcopy=False) if winner and t.number == winner.number), None)
    first_broken = (broken_text(dict(first.constraints or {}), trial_attrs(first).metrics)
                    if first is not None and winner.feasible and not _feasible(first) else "")
    figs = {"pareto": pareto_figure(study, objectives, winner.number if winner else None, judged),
            "history": history_figure(study, metric), "importance": importance_figure(study, metric)}
    if (curve := load_curve_figure(path, summary, config.workload)) is not None:
        figs["load_curve"] = curve
    parts = []
    for name, fig in figs.items():
        if fig is None:
            why = ("one objective, so no front: the history below ranks the trials"
                   if name == "pareto" and len(objectives) < 2 else "not enough measured trials yet")
            parts.append(f"<p class='missing' id='{name}-missing'>{name}: {why}</p>")
        else:
            fig.update_layout(width=FIG_W, height=FIG_H)
            parts.append(f"<div class='plot'>{fig.to_html(full_html=False, include_plotlyjs=False, div_id=name)}</div>")
    name = html.escape(config.study.name)
    shown = [k for k in HEADROOM_COLUMNS if any(k in trial_attrs(t).metrics for t in study.trials)]
    metrics = list(dict.fromkeys([metric, *objectives, *shown]))
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>autotune report: {name}</title>"
            f"<style>{CSS}</style><script>{plotly.offline.get_plotlyjs()}</script></head><body>"
            f"<h1>autotune study {name}</h1><p>engine {html.escape(config.engine.kind)}; "
            f"{len(study.trials)} trials recorded (budget {config.study.n_trials} launched); objectives "
            + ", ".join(html.escape(_label(o)) for o in objectives) + "</p>"
            + "".join(parts) + verdict_html(
                summary, (summary and summary.constraints) or constraints_as_written(config), metric, first_broken)
            + headroom_html(summary) + prediction_html(summary)
            + "<h2>Every trial</h2>" + trials_table(study, metrics) + "</body></html>")
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "report.html"]
    write_atomic(files[0], page)
    files[0].chmod(0o644)
    if png:
        files += write_pngs({k: f for k, f in figs.items() if f is not None}, out, FIG_W, FIG_H)
    return files
