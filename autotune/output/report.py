"""Live progress and the final summary on the console (rich).

:class:`Reporter` prints one line per trial event above a progress bar (trials done of the
budget, elapsed, time left, best so far and its speed-up over trial 0), then a second bar
for the re-measurement, then the summary table. :func:`print_summary` and
:func:`print_studies` serve ``autotune report`` and ``autotune ls``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from rich.console import Console
from rich.progress import BarColumn
from rich.progress import MofNCompleteColumn
from rich.progress import Progress
from rich.progress import TextColumn
from rich.progress import TimeElapsedColumn
from rich.progress import TimeRemainingColumn
from rich.table import Table

from autotune.objectives import get_metric
from autotune.record.summary import StudySummary
from autotune.record.summary import baseline_label
from autotune.search.samplers import resolve

if TYPE_CHECKING:
    from autotune.config.schema import Config
    from autotune.record.study_dirs import StudyState
    from autotune.search.trials import Record
    from autotune.trial.spec import TrialResult

SLOW_STEP_S = 3.0  # a driver step that takes longer says what it is doing

COLUMNS = ("decode_tps", "prefill_tps", "ttft_p50_ms", "ttft_p95_ms", "ppl_delta_pct", "kld_mean", "peak_rss_mb",
           "goodput_tps", "goodput_rps", "max_concurrency_at_slo", "max_rate_at_slo", "roofline_pct",
           "energy_j_per_token")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"
    return "-" if v is None else str(v)


class Reporter:
    """Prints one line per trial event and a table at the end."""

    def __init__(self, cfg: Config, console: Console | None = None) -> None:
        self.cfg = cfg
        self.console = console or Console(highlight=False)
        self.best: float | None = None
        self.base: float | None = None  # trial 0's value of the selection metric
        self.progress: Progress | None = None
        self.task: Any = None
        self._launched: set[int] = set()
        self._remeasuring = False
        self._steps: list[str] = []  # the driver steps in progress (slow_step), innermost last

    # ---- progress bar ------------------------------------------------------------------
    def _best_text(self) -> str:
        sel = self.cfg.select.metric
        if self.best is None:
            return f"best {sel} -"
        unit = get_metric(sel).unit
        x = get_metric(sel).speedup(self.best, self.base)
        return f"best {sel} {_fmt(self.best)} {unit}" + (f" ({x:.2f}x trial 0)" if x else "")

    def _bar(self, what: str, total: int, done: int) -> None:
        """A new bar; the previous one stays on screen (or in the log) as it ended."""
        self.close()
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
            TextColumn("{task.fields[best]}"), console=self.console)
        self.progress.start()
        self.task = self.progress.add_task(what, total=total, completed=min(done, total), best=self._best_text())

    def _advance(self) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, advance=1, best=self._best_text())

    def remeasure_plan(self, n_runs: int) -> None:
        """The re-measurement starts: ``n_runs`` engine runs (candidates x repeats)."""
        self._bar("re-measure", n_runs, 0)
        self._remeasuring = True

    def close(self) -> None:
        """Stop the progress bar (idempotent)."""
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
            self.task = None

    def _seed_best(self, study) -> None:
        """Best so far and trial 0's value from a resumed study's finished trials."""
        from autotune.record.optuna_study import records
        from autotune.record.study_dirs import best_feasible

        sel = self.cfg.select.metric
        recs = records(study)
        best = best_feasible(recs, sel)
        self.best = best.metrics[sel] if best else None
        base = next((r for r in recs if r.number == 0), None)
        self.base = base.metrics.get(sel) if base else None

    @contextmanager
    def slow_step(self, what: str, after_s: float = SLOW_STEP_S) -> Iterator[None]:
        """Say ``what`` the driver is doing when it takes more than ``after_s`` (from a timer
        thread; rich's console is thread-safe), and how long it took. Nested steps: only the
        innermost one speaks."""
        self._steps.append(what)
        t0, said = time.monotonic(), threading.Event()

        def say() -> None:
            if self._steps and self._steps[-1] == what:
                said.set()
                self.note(f"{what} ...")

        timer = threading.Timer(after_s, say)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            self._steps.pop()
            if said.is_set():
                self.note(f"{what}: done in {time.monotonic() - t0:.1f} s")

    def note(self, text: str) -> None:
        self.console.print(f"[dim]{text}[/dim]")

    def warn(self, text: str) -> None:
        self.console.print(f"[yellow]warning:[/yellow] {text}")

    def start(self, study, resumed: bool, done: int) -> None:
        c = self.cfg
        what = f"resuming ({done} trials done)" if resumed else "new study"
        self.console.print(
            f"[bold]autotune[/bold] study [cyan]{c.study.name}[/cyan] ({what}), engine {c.engine.kind}, "
            f"sampler {c.study.sampler}"
            + (f" ({resolve(c.study.sampler, c.study.search, len(c.objectives))})" if c.study.sampler == "auto" else "")
            + f", {c.study.n_trials} trials; objectives "
            + ", ".join(f"{o.metric} ({o.direction})" for o in c.objectives)
            + ("; constraints " + ", ".join(map(str, c.constraints)) if c.constraints else "")
        )
        self.console.print(c.workload.describe())
        self.console.print(f"[dim]storage {c.storage_url}; MLflow {c.tracking.uri}[/dim]")
        if resumed:
            self._seed_best(study)
        self._bar("trials", c.study.n_trials, done)

    def started(self, number: int, params: dict) -> None:
        self._launched.add(number)
        self.console.print(f"[dim]  #{number} started {self._params(params)}[/dim]")

    def _params(self, params: dict) -> str:
        return " ".join(f"{k}={v}" for k, v in params.items())

    def finished(self, r: Record, duration_s: float) -> None:
        launched = r.number in self._launched
        self._launched.discard(r.number)
        self._print_finished(r, duration_s)
        if launched:  # proposals refused before launch do not use the budget
            self._advance()

    def _print_finished(self, r: Record, duration_s: float) -> None:
        sel = self.cfg.select.metric
        if r.number == 0 and r.status == "ok":
            self.base = r.metrics.get(sel)
        if r.status == "stopped":  # its reason says "stopped early: ..."; then its partial numbers
            shown = " ".join(f"{k}={_fmt(r.metrics.get(k))}" for k in COLUMNS if k in r.metrics)
            self.console.print(f"  #{r.number} [yellow]{r.reason[:200]}[/yellow] [dim]partial: {shown} "
                               f"({duration_s:.1f} s) {self._params(r.params)}[/dim]")
            return
        if r.status != "ok":
            color = "yellow" if r.status == "infeasible" else "red"
            self.console.print(f"  #{r.number} [{color}]{r.status}[/{color}] {r.reason[:160]} "
                               f"[dim]{self._params(r.params)}[/dim]")
            return
        m = get_metric(sel)
        val = r.metrics.get(sel)
        if r.feasible and val is not None and (self.best is None or m.better(val, self.best)):
            self.best = val
        mark = "[green]feasible[/green]" if r.feasible else "[yellow]violates " + ", ".join(
            k for k, v in r.violations.items() if v > 0) + "[/yellow]"
        shown = " ".join(f"{k}={_fmt(r.metrics.get(k))}" for k in COLUMNS if k in r.metrics)
        self.console.print(f"  #{r.number} ok {shown} {mark} ({duration_s:.1f} s) best {sel}={_fmt(self.best)}")

    def remeasured(self, number: int, rep: int, res: TrialResult) -> None:
        sel = self.cfg.select.metric
        self.console.print(f"[dim]  re-measure #{number} run {rep + 1}: {res.status} "
                           f"{sel}={_fmt(res.metrics.get(sel))}[/dim]")
        if not self._remeasuring:  # no plan given: at most top_k + baseline
            s = self.cfg.select
            self.remeasure_plan((s.top_k + 1) * s.rerun_repeats)
        self._advance()

    def summary(self, s: StudySummary, files: list[Path]) -> None:
        """The end-of-study table of ``s`` (the summary ``summary.json`` holds, export notes included)."""
        self.close()
        render_summary(self.console, s, self.cfg.select.metric, files)


def render_summary(console: Console, s: StudySummary, sel: str, files: list[Path]) -> None:
    """Counts, baseline vs winner table, speed-up with its noise verdict, warnings, files."""
    console.print()
    console.print(
        f"[bold]{s.n_trials} trials[/bold]: {s.n_feasible} feasible, {s.n_infeasible} infeasible, "
        f"{s.n_failed} failed" + (f", {s.n_stopped} stopped early" if s.n_stopped else "")
        + f"; {s.elapsed_s:.0f} s"
    )
    if s.overhead_s is not None:
        console.print(f"search overhead {s.overhead_s:.0f} s of {s.elapsed_s:.0f} s")
    if s.n_rejected or s.n_duplicates:
        console.print(f"{s.n_rejected} proposals refused before launch, "
                      f"{s.n_duplicates} repeats reused (not counted)")
    if s.stop_reason:
        console.print(f"[yellow]warning:[/yellow] {s.stop_reason}")
    for line in s.prediction.lines() if s.prediction else []:
        console.print(line)
    base, win = s.baseline, s.winner
    if win is None:
        console.print("[red]No feasible configuration found.[/red] " + (s.note or ""))
    else:
        defaults = baseline_label(s.engine)
        console.print(f"[bold]baseline (trial 0, {defaults.removeprefix('the ')}) vs winner[/bold]",
                      soft_wrap=True)
        t = Table()
        t.add_column("metric")
        t.add_column(f"baseline #{base.number}" if base else "baseline")
        t.add_column(f"winner #{win.number}")
        for k in COLUMNS:
            if k in win.metrics:
                t.add_row(k, _fmt(base.metrics.get(k)) if base else "-", _fmt(win.metrics.get(k)))
        console.print(t)
        console.print("winner params: " + " ".join(f"{k}={v}" for k, v in win.params.items()))
        if s.headroom:
            for line in (s.headroom.roofline_words(), s.headroom.energy_words()):
                if line:
                    console.print(f"headroom: {line}")
        if base and win.number == base.number:
            console.print(f"[yellow]No configuration beat {defaults} under your "
                          "constraints: keep them (or widen the space / add trials).[/yellow]")
        elif s.speedup is not None:
            words = s.noise_words(s.speedup_within_noise, win.number, base.number if base else None)
            noise = f" [yellow]({words})[/yellow]" if s.speedup_within_noise else ""
            over = "the engine default" if defaults == "the engine defaults" else defaults
            console.print(f"[bold green]speed-up over {over}: {s.speedup:.2f}x[/bold green] "
                          f"in {sel} ({s.speedup_source or ''}){noise}")
        if bad_base := s.baseline_words():
            console.print(f"[yellow]{bad_base}: it does not meet your constraints[/yellow]")
        for row in s.remeasured_rows():
            if row.dropped and row.trial != str(base.number if base else None):
                console.print(f"[yellow]candidate #{row.trial} was dropped after its re-measurement: "
                              f"{row.dropped}[/yellow]")
        if s.lead_within_noise:
            words = s.noise_words(True, win.number, s.runner_up)
            console.print(f"[yellow]the winner's lead over #{s.runner_up} is {words}[/yellow]")
    for w in s.warnings or []:
        console.print(f"[yellow]warning:[/yellow] {w}")
    if files:
        console.print("files: " + ", ".join(str(f) for f in files))


def print_summary(path: Path, console: Console | None = None) -> None:
    """``autotune report``: the summary of a study directory (or its state if it has none)."""
    from autotune.record.study_dirs import read_config
    from autotune.record.study_dirs import read_summary
    from autotune.record.study_dirs import state_of

    console = console or Console(highlight=False)
    s = read_summary(path)
    if s is None:
        st = state_of(path)
        console.print(f"study {st.name} is {st.state}: {st.done} of {st.total} trials, no summary yet "
                      f"(best {st.metric} {_fmt(st.best)} at trial {st.best_trial})")
        return
    render_summary(console, s, read_config(path).select.metric, [])


def print_studies(states: list[StudyState], console: Console | None = None) -> None:
    """``autotune ls``: one row per study."""
    console = console or Console(highlight=False)
    if not states:
        console.print("no studies (folders with an optuna.db) here")
        return
    t = Table()
    for col in ("study", "state", "trials", "feasible", "best so far", "speed-up", "path"):
        t.add_column(col)
    for st in states:
        unit = get_metric(st.metric).unit
        best = f"{st.metric} {_fmt(st.best)} {unit} (#{st.best_trial})" if st.best is not None else "-"
        t.add_row(st.name, st.state, f"{st.done}/{st.total}", str(st.feasible), best,
                  f"{st.speedup:.2f}x" if st.speedup else "-", str(st.path))
    console.print(t)
