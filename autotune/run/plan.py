"""``--dry-run``: print the resolved config, the compiled space, rules, objectives and plan.

Nothing is written and no trial, Ray runtime or MLflow store is started: the plan is
computed from the config alone (plus NVML, read-only, for the GPUs of this machine).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import TYPE_CHECKING
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from autotune.hardware import cpu_count
from autotune.hardware import list_gpus
from autotune.run.cluster import resource_plan
from autotune.search.samplers import resolve

if TYPE_CHECKING:
    from autotune.config.schema import Config
    from autotune.search.space import Space

SAMPLER_NOTES = {
    "bo": "bo (Gaussian process over the launchable configurations, speed prediction as prior)",
    "bo pareto": "bo (Gaussian process over the launchable configurations, speed prediction as prior; "
                 "expected hypervolume improvement of the two objectives' front)",
    "tpe": "tpe (multivariate, grouped for conditional parameters, constant liar)",
    "gp": "gp (Gaussian process, torch)",
    "nsga2": "nsga2 (genetic, multi-objective)",
    "random": "random",
    "grid": "grid (every configuration in turn)",
}


def describe_param(p) -> str:
    """One line: the values a parameter takes, and its condition."""
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
    """Print the plan of a study; run nothing, write nothing."""
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
    c.print("rules (checked before launch; a breaking proposal is recorded infeasible, never run):")
    for r in space.rules:
        expr = r.require.text + (f" when {r.when.text}" if r.when else "")
        c.print(f"  {r.path}: {expr}" + (f"  ({r.reason})" if r.reason != expr else ""))
    if not space.rules:
        c.print("  none")
    c.print("objectives: " + ", ".join(f"{o.metric} ({o.direction})" for o in cfg.objectives))
    c.print("constraints: " + (", ".join(map(str, cfg.constraints)) or "none")
            + ("; 'baseline' is trial 0's measurement (the engine's defaults), which runs first"
               if any(x.factor is not None for x in cfg.constraints) else ""))
    c.print(f"winner: select.rule {cfg.select.rule} "
            + (f"on {cfg.select.metric}" if cfg.select.rule == "max" else
               f"weights {cfg.select.weights}" if cfg.select.rule == "weighted" else "over the objectives")
            + (f"; top {cfg.select.top_k} re-measured x{cfg.select.rerun_repeats} with the baseline"
               if cfg.select.top_k and cfg.select.rerun_repeats else "; no re-measurement"))
    c.rule("resource plan")
    res = space.engine.resources(baseline, cfg.engine.settings)
    gpus = list_gpus()
    c.print(f"this machine: {cpu_count()} CPUs, "
            + (", ".join(f"GPU{g.index} {g.name} {g.memory_gb:.0f} GB" for g in gpus) or "no GPU"))
    c.print(f"trial 0 (baseline) reserves {res.num_cpus:g} CPU, {res.num_gpus:g} GPU"
            + (f", {res.custom}" if res.custom else ""))
    for line in resource_plan(cfg, space):
        c.print(line, markup=False)
    need = space.engine.preflight(cfg.engine.settings, build=False)
    if need:
        c.print(f"[yellow]cannot run here: {need[0]}[/yellow]")
    c.print(f"Ray: {cfg.ray.address or 'local embedded'}; max concurrent trials: "
            f"{cfg.ray.max_concurrent or 'as resources allow'}")
    text = space.engine.describe_launch(baseline, cfg.engine.settings, cfg.engine.variants,
                                        asdict(cfg.workload))
    if text:
        c.print(f"trial 0 runs: {text}", markup=False)
    c.rule("study")
    budget = f"{cfg.study.n_trials} trials" + (
        f" or {cfg.study.timeout_s:g} s, whichever comes first" if cfg.study.timeout_s else "")
    c.print(f"budget: {budget}; each trial at most {cfg.study.trial_timeout_s:g} s")
    name = resolve(cfg.study.sampler, cfg.study.search, len(cfg.objectives))
    auto = "auto -> " if cfg.study.sampler == "auto" else ""
    note = SAMPLER_NOTES.get(f"{name} {cfg.study.search}", SAMPLER_NOTES.get(name, name))
    c.print(f"sampler: {auto}{note}, seed {cfg.study.seed}")
    c.print(f"trial 0: the baseline {baseline}", markup=False)
    for i, item in enumerate(cfg.study.enqueue):
        c.print(f"trial {i + 1}: enqueued {item}", markup=False)
    c.print(f"storage {cfg.storage_url}; MLflow {cfg.tracking.uri if cfg.tracking.enabled else 'off'}",
            markup=False)
    c.print("[dim]dry run: no trial was started and nothing was written[/dim]")
