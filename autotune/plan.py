"""``--dry-run``: print the resolved config, the compiled space, rules, objectives and plan."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from autotune.engines.base import cpu_count

if TYPE_CHECKING:
    from autotune.config import Config
    from autotune.space import Space


def describe_param(p) -> str:
    d = p.dist
    if d is None:
        text = f"fixed {p.value!r}"
    elif hasattr(d, "choices"):
        text = "one of " + ", ".join(map(str, p.values()))
    else:
        kind = "int" if type(d).__name__.startswith("Int") else "float"
        text = f"{kind} [{d.low}, {d.high}]" + (" log" if d.log else "") + (f" step {d.step}" if d.step not in (None, 1) else "")
    return text + (f"  (when {p.when.text})" if p.when else "")


def print_plan(cfg: Config, space: Space, baseline: dict[str, Any], console: Console | None = None) -> None:
    from autotune.gpus import list_gpus

    c = console or Console(highlight=False)
    c.rule("resolved config")
    c.print(yaml.safe_dump(cfg.raw, sort_keys=False), markup=False)
    c.rule("search space")
    t = Table()
    t.add_column("parameter")
    t.add_column("values")
    t.add_column("baseline")
    for name, p in space.params.items():
        t.add_row(name, describe_param(p), str(baseline.get(name, "-")))
    c.print(t)
    size = space.size()
    c.print(f"space size: {'continuous' if math.isinf(size) else f'{int(size):,} configurations'}")
    c.print("rules: " + ("; ".join(f"{r.reason}" for r in space.rules) or "none"))
    c.print("objectives: " + ", ".join(f"{o.metric} ({o.direction})" for o in cfg.objectives))
    c.print("constraints: " + (", ".join(map(str, cfg.constraints)) or "none"))
    c.rule("resource plan")
    res = space.engine.resources(baseline, cfg.engine.settings)
    gpus = list_gpus()
    c.print(f"this machine: {cpu_count()} CPUs, "
            + (", ".join(f"GPU{g.index} {g.name} {g.memory_gb:.0f} GB" for g in gpus) or "no GPU"))
    c.print(f"trial 0 (baseline) reserves {res.num_cpus:g} CPU, {res.num_gpus:g} GPU"
            + (f", {res.custom}" if res.custom else ""))
    need = space.engine.preflight(cfg.engine.settings)
    if need:
        c.print(f"[yellow]cannot run here: {need[0]}[/yellow]")
    c.print(f"Ray: {cfg.ray.address or 'local embedded'}; max concurrent trials: "
            f"{cfg.ray.max_concurrent or 'as resources allow'}")
    c.print(f"study: {cfg.study.n_trials} trials, sampler {cfg.study.sampler}, storage {cfg.storage_url}")
    c.print("[dim]dry run: no trial was started and nothing was written[/dim]")
