"""Live progress and the final summary on the console (rich)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from rich.console import Console
from rich.table import Table

from objectives import get_metric

if TYPE_CHECKING:
    from autotune.config import Config
    from autotune.select import Record
    from autotune.trial.spec import TrialResult

COLUMNS = ("decode_tps", "prefill_tps", "ttft_p50_ms", "ttft_p95_ms", "ppl_delta_pct", "kld_mean", "peak_rss_mb")


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

    def note(self, text: str) -> None:
        self.console.print(f"[dim]{text}[/dim]")

    def warn(self, text: str) -> None:
        self.console.print(f"[yellow]warning:[/yellow] {text}")

    def start(self, study, resumed: bool, done: int) -> None:
        c = self.cfg
        what = f"resuming ({done} trials done)" if resumed else "new study"
        self.console.print(
            f"[bold]autotune[/bold] study [cyan]{c.study.name}[/cyan] ({what}), engine {c.engine.kind}, "
            f"sampler {c.study.sampler}, {c.study.n_trials} trials; objectives "
            + ", ".join(f"{o.metric} ({o.direction})" for o in c.objectives)
            + ("; constraints " + ", ".join(map(str, c.constraints)) if c.constraints else "")
        )
        w = c.workload
        self.console.print(
            f"workload {w.name}: '{w.prompts}' prompts, {w.max_tokens} new tokens, {w.warmup} warm-up + "
            f"{w.repeats} measured rounds at concurrency {w.concurrency} (latency constraints hold at this load)"
        )
        self.console.print(f"[dim]storage {c.storage_url}; MLflow {c.tracking.uri}[/dim]")

    def started(self, number: int, params: dict) -> None:
        self.console.print(f"[dim]  #{number} started {self._params(params)}[/dim]")

    def _params(self, params: dict) -> str:
        return " ".join(f"{k}={v}" for k, v in params.items())

    def finished(self, r: Record, duration_s: float) -> None:
        sel = self.cfg.select.metric
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

    def summary(self, s: dict[str, Any], files: list[Path]) -> None:
        self.console.print()
        self.console.print(
            f"[bold]{s['n_trials']} trials[/bold]: {s['n_feasible']} feasible, {s['n_infeasible']} infeasible, "
            f"{s['n_failed']} failed; {s['elapsed_s']:.0f} s"
        )
        base, win = s.get("baseline"), s.get("winner")
        if win is None:
            self.console.print("[red]No feasible configuration found.[/red] " + s.get("note", ""))
        else:
            self.console.print("[bold]baseline (trial 0, engine defaults) vs winner[/bold]", soft_wrap=True)
            t = Table()
            t.add_column("metric")
            t.add_column(f"baseline #{base['number']}" if base else "baseline")
            t.add_column(f"winner #{win['number']}")
            for k in COLUMNS:
                if k in win["metrics"]:
                    t.add_row(k, _fmt(base["metrics"].get(k)) if base else "-", _fmt(win["metrics"].get(k)))
            self.console.print(t)
            self.console.print("winner params: " + self._params(win["params"]))
            if base and win["number"] == base["number"]:
                self.console.print("[yellow]No configuration beat the engine defaults under your "
                                   "constraints: keep them (or widen the space / add trials).[/yellow]")
            elif "speedup" in s:
                noise = ""
                if s.get("speedup_within_noise"):
                    noise = " [yellow](within noise)[/yellow]"
                self.console.print(f"[bold green]speed-up over the engine default: {s['speedup']:.2f}x[/bold green] "
                                   f"in {self.cfg.select.metric} ({s.get('speedup_source', '')}){noise}")
            if s.get("lead_within_noise"):
                self.console.print(f"[yellow]the winner's lead over #{s.get('runner_up')} is within noise[/yellow]")
        for w in s.get("warnings", []):
            self.warn(w)
        self.console.print("files: " + ", ".join(str(f) for f in files))
