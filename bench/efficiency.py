"""How fast each search method finds the true feasible optimum on simulated surfaces.

Each study runs a preset of ``bench/surfaces/`` (a ``kind: command`` engine running
``bench/surfaces/sim.py``, a simulated engine with seeded log-normal timing noise) either
through the real CLI (``autotune run --config-dir bench/surfaces conf=SURFACE ...`` in its
own process: driver, Optuna storage, Ray placement, trial workers) or, with ``--fast``, in
process through the real driver loop and sampler with the trial evaluated in-process
(bench/surfaces/fast.py: seconds a study, no Ray, no MLflow). The bench knows each
surface's noise-free truth (bench/surfaces/truth.py), so it scores a study by the TRUE
value of the configuration the study would pick after n launched trials (best measured
feasible), divided by the true feasible optimum.

Every study runs in a prior mode (``--modes``, issue 23): ``none`` (the preset without its
``predict`` block, as a user of a custom engine would run it), ``physics`` (the preset's
block, written from public numbers only: model shapes, published memory and bandwidth,
documented or round-guess overheads) and ``misleading`` (``bench/surfaces/prior/
SURFACE_misleading.yaml`` over it: every drafted token accepted, bandwidth 2x off, an
overhead missing). The timing noise is paired: it depends only on the configuration, the
repeat and the seed (``engine.settings.vars.noise_seed``), never on the method.

Seeds 0-9 of TUNE_SURFACES are the "tune" set (look at these while changing the sampler);
seeds 100-119 of every surface are the "report" set; each row says which.

Per surface x mode x method: median best-so-far / optimum at 10, 20 and 30 launched trials,
the share of seeds reaching 95% by 20 with its Wilson 95% interval, the median number of
trials to reach 95% [quartiles]. ``random*`` is the analytic median for uniform random
sampling over the physics-launchable configurations. "exported 95%": the share whose exported
winner (chosen on the end-of-study re-measurement, which the fast mode runs through the driver
too; ``+runs``: its launches) is within 95%; method ``default_rm33`` is the default search with
autotune's own re-measurement defaults (bench/results/exported.txt).

    python bench/efficiency.py --fast --first-seed 100 --seeds 20 --jobs 1     # report set
    python bench/efficiency.py --fast --tune                                   # tune set
    python bench/efficiency.py --fast --tune --variant bo2025     # tune set, the old default bo
    python bench/efficiency.py --surfaces vllm_h100 --methods default,random --modes none \
        --first-seed 100 --seeds 2 --jobs 1                                    # real CLI
    python bench/efficiency.py --smoke                 # seconds: in-process random on the truths
    python bench/efficiency.py --fast --families all --split tune --seeds 10 --modes none \
        --methods default,random,tpe,gp --jobs 1     # issue 41: instances of the surface families
    python bench/efficiency.py --smoke --families all  # the families' truths in smoke size
    python bench/efficiency.py --fast --families all --split tune --seeds 6 --modes none \
        --methods default --variant base,lazycover,edge --jobs 1   # variants side by side

``--families`` (bench/surfaces/instances.py): each surface, and the MoE one, as a family of instances
(bench/surfaces/families.py), instance seeds of ``--split tune`` (1000-) or ``report``
(5000-, held out); a table per family with the worst decile's best@20.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import replace
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "surfaces"))
sys.path.insert(0, str(ROOT))

import instances  # noqa: E402
from stats import _median  # noqa: E402
from stats import _n  # noqa: E402
from stats import _quartiles  # noqa: E402, F401 (tests use efficiency._quartiles)
from stats import shift  # noqa: E402
from stats import side_by_side  # noqa: E402
from stats import verdicts  # noqa: E402
from stats import wilson  # noqa: E402
from truth import Truth  # noqa: E402
from truth import load  # noqa: E402
from truth import satisfies  # noqa: E402

SURFACES = ("exl2_70b", "streamer_70b", "llamacpp_7b", "cpu_7b", "vllm_h100", "llamacpp_noisy")
FAMILIES = (*SURFACES, "moe_30b")  # issue 41: each surface's family and the MoE one
TUNE_SURFACES = ("exl2_70b", "llamacpp_7b", "vllm_h100")  # seeds 0-9 of these: the tune set
REPORT_SEEDS = range(100, 120)
MODES = {  # prior mode -> overrides (issue 23); {s}: the surface
    "none": ["~engine.settings.predict"],
    "physics": [],
    "misleading": ["+prior={s}_misleading"],
}
METHODS = {  # name -> overrides on top of the preset (the preset leaves the defaults alone)
    "default": [],
    # the same search; the winner re-measured as autotune's defaults do (3 candidates and the
    # baseline, 3 runs each), where the surfaces re-run 2 candidates once to keep CLI studies short
    "default_rm33": ["select.top_k=3", "select.rerun_repeats=3"],
    "random": ["study.sampler=random"],
    "tpe": ["study.sampler=tpe"],
    "tpe_pareto": ["study.sampler=tpe", "study.search=pareto"],
    "gp": ["study.sampler=gp"],  # Optuna's GPSampler after the design (the default before bo)
    "grid": ["study.sampler=grid"],
}
# --variant NAME: a sampler variant A/B'd in the fast mode (module attributes of
# autotune.search.bo set before the studies run; the product's defaults are untouched). Rows are
# labelled METHOD:NAME. bench/results/robust.txt holds what these and the variants tried and
# dropped (a smaller startup without a prior, a trust region, the bound as a GP input) gave.
VARIANTS: dict[str, dict[str, dict[str, object]]] = {
    "bo2025": {"bo": {"LENGTH_SCALE_MIN": 0.05}},  # the default before issue 23's item 2
    "ls02": {"bo": {"LENGTH_SCALE_MIN": 0.2}},
    "ls04": {"bo": {"LENGTH_SCALE_MIN": 0.4}},
    "lsmax1": {"bo": {"LENGTH_SCALE_MAX": 1.0}},
    "sd15": {"bo": {"SD_SCALE": 1.5}},
    "sd2": {"bo": {"SD_SCALE": 2.0}},
    "sd05": {"bo": {"SD_SCALE": 0.5}},
    "sd075": {"bo": {"SD_SCALE": 0.75}},
    "rs6": {"bo": {"RESTARTS": 6}},
    "norefine": {"bo": {"REFINE": 0}},  # a sampled pool does not grow near the best measured
    "refine1": {"bo": {"REFINE": 1}},
    "refine4": {"bo": {"REFINE": 4}},
    "noexpect": {"bo": {"EXPECT": False}},  # session 27: the constraint GPs without the prior's expected values
    "nocover": {"design": {"COVER": False}},  # issue 41: the design without the level coverage
    "cover4": {"design": {"COVER_MAX": 4}},
    "coverspread": {"design": {"COVER_NEAR": False}},  # covering points spread (maximin), not near trial 0
    # issue 41 items 3-4: the local search after the design (autotune.search.local) and a lazy cover
    "edge": {"local": {"EDGE": True}},  # edge probes (bisection toward a crash/constraint edge), every 2nd ask
    "edge1": {"local": {"EDGE": True, "EVERY": 1}},  # ... on every model ask where one exists
    "edge4": {"local": {"EDGE": True, "EVERY": 4}},  # ... on every 4th model ask
    "edgem": {"local": {"EDGE": True, "MEASURED": True}},  # only measured (or refused) bad values are edges
    "edgem4": {"local": {"EDGE": True, "MEASURED": True, "EVERY": 4}},
    "trust": {"local": {"TRUST": True}},  # a trust region around the best 2 feasible, every 2nd ask
    "edgetrust": {"local": {"EDGE": True, "TRUST": True}},  # edge probes, else the trust region
    "lazycover": {"design": {"COVER_LAZY": True}},  # no prior: cover within the design, the rest by bo (default)
    "eagercover": {"design": {"COVER_LAZY": False}},  # the design covers every level itself (before)
    "lazyedge": {"design": {"COVER_LAZY": True}, "local": {"EDGE": True}},
    "lazytrust": {"design": {"COVER_LAZY": True}, "local": {"TRUST": True}},
    # issue 41, session 23: memory as a learned constraint (autotune.search.memory)
    "memory": {"memory": {"MEMORY": True}},
    "memnocut": {"memory": {"MEMORY": True, "CUT": 0.0}},
    "memridge": {"memory": {"MEMORY": True, "FULL": 0.99, "MODEL": "ridge"}},
    "memoom": {"memory": {"MEMORY": True, "AFTER_OOM": True}},  # ... only once a launch ran out of memory
    "memfull": {"memory": {"MEMORY": True, "FULL": 0.99}},  # a run at >= 99% of the card counts as out of memory
    "memoomfull": {"memory": {"MEMORY": True, "AFTER_OOM": True, "FULL": 0.99}},
    "mempad0": {"memory": {"MEMORY": True, "FULL": 0.99, "PAD": 0.0}},  # memfull, failures imputed at the card
    "memlin": {"memory": {"MEMORY": True, "FULL": 0.99, "MODEL": "lingp"}},
    # session 24: the memory model reads what an out-of-memory line says was needed (OOM_SIZE) and
    # judges a spill against what the GPUs had free at the start (FREE_AT_START); the MoE surface's
    # VRAM read as a real box reads it (bench/surfaces/moe.py SPILL_READ "free")
    "freeread": {"memory": {"FREE_AT_START": False, "OOM_SIZE": False}},  # the code before, today's surface
    "cardread": {"moe": {"SPILL_READ": "card"}, "memory": {"FREE_AT_START": False, "OOM_SIZE": False}},  # both before
    "nooomsize": {"memory": {"OOM_SIZE": False}},
    "nofree": {"memory": {"FREE_AT_START": False}},
    "maximin": {"design": {"SPREAD": "maximin"}},  # no prior: the design's spread points by maximin (before session 24)
    "noctx": {"context": {"CONTEXT": False}},  # a context overflow stays a "does it run" point (before session 25)
    "nomove": {"context": {"MOVE_DESIGN": False}},  # design points launched at a context already seen too small (before session 30)
}
SURFACE_MODULES = ("moe", "models")  # bench/surfaces modules a variant may set (fast mode only)
CHECKPOINTS = (10, 20, 30)


@dataclass(frozen=True)
class Run:
    """One study's score: best-so-far ratio after each launched trial, and its exported winner."""

    surface: str
    method: str
    seed: int
    rc: int
    wall_s: float
    curve: tuple[float, ...]  # true value of the best measured-feasible config / optimum
    winner_ok: bool | None  # the exported winner is the true best of the re-measured candidates
    error: str = ""
    mode: str = "physics"  # prior mode (MODES)
    via: str = "cli"  # cli or fast (in-process driver loop)
    # true value of the best config measured feasible so far, whichever measurement won: what the
    # search found, before the timing noise picks among it (empty: not scored, older results)
    found: tuple[float, ...] = ()
    # true value / optimum of the winner the study exports, chosen on the end-of-study
    # re-measurement (None: not scored, older results), and how many launches that re-measurement took
    exported: float | None = None
    remeasure_runs: int = 0

    @property
    def set(self) -> str:
        """report (seeds 100-119), tune (seeds 0-9 of TUNE_SURFACES) or other."""
        if instances.split_of(self.seed):
            return instances.split_of(self.seed)
        if self.seed in REPORT_SEEDS:
            return "report"
        return "tune" if self.seed < 10 and self.surface in TUNE_SURFACES else "other"

    def at(self, n: int) -> float:
        if not self.curve:
            return 0.0
        return self.curve[min(n, len(self.curve)) - 1]

    def trials_to(self, level: float) -> float:
        return next((i + 1 for i, r in enumerate(self.curve) if r >= level), math.inf)


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def curves_of(truth: Truth, trials: list[tuple[dict, str, dict]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Over launched trials [(params, status, measured metrics)]: the best-so-far true ratio
    (``Run.curve``) and the ratio of the truly best configuration measured feasible (``Run.found``)."""
    best_measured, best_true, found, curve, found_curve = -math.inf, 0.0, 0.0, [], []
    for params, status, metrics in trials:
        if status == "ok" and satisfies(metrics, truth.constraints):
            found = max(found, truth.credit(params))
            if metrics[truth.metric] > best_measured:
                best_measured, best_true = metrics[truth.metric], truth.credit(params)
        curve.append(min(best_true / truth.optimum, 1.0))
        found_curve.append(min(found / truth.optimum, 1.0))
    return tuple(curve), tuple(found_curve)


def winner_scores(truth: Truth, params_of: dict[int, dict], winner: int | None,
                   candidates: list[int]) -> tuple[bool | None, float]:
    """Whether the exported ``winner`` is the true best (within 0.5%) of the re-measured
    ``candidates`` (None: nothing re-measured), and its true value / optimum (0: no winner)."""
    if winner is None or winner not in params_of:
        return None, 0.0
    exported = min(truth.credit(params_of[winner]) / truth.optimum, 1.0)
    values = [truth.credit(params_of[n]) for n in candidates if n in params_of]
    return (truth.credit(params_of[winner]) >= 0.995 * max(values) if values else None), exported


def score(truth: Truth, study_dir: Path) -> tuple[tuple[float, ...], bool | None, float]:
    """Best-so-far curve over launched trials, whether the exported winner is right and its
    true value / optimum."""
    params_of: dict[int, dict] = {}
    trials = []
    for d in sorted((study_dir / "trials").glob("[0-9]*")):
        spec, result = _read(d / "spec.json"), _read(d / "result.json")
        if not spec:
            continue
        params_of[int(spec["number"])] = spec["params"]
        trials.append((spec["params"], result.get("status"), result.get("metrics") or {}))
    curve = list(curves_of(truth, trials)[0])
    summary = _read(study_dir / "summary.json")
    winner = (summary.get("winner") or {}).get("number")
    by_trial = ((summary.get("remeasured") or {}).get("by_trial") or {})
    return (tuple(curve), *winner_scores(truth, params_of, None if winner is None else int(winner),
                                          [int(n) for n in by_trial]))


def overrides(truth: Truth, method: str, mode: str, seed: int, trials: int) -> list[str]:
    """What a study adds to ``conf=SURFACE``: seed, budget, method, prior mode, paired noise."""
    inst = getattr(truth, "instance", -1)
    return [f"conf={truth.name}", f"study.seed={seed}", f"study.n_trials={trials}",
            f"engine.settings.vars.noise_seed={seed}", *METHODS[method],
            *([f"engine.settings.vars.instance={inst}"] if inst >= 0 else []),
            *(o.format(s=truth.name) for o in MODES[mode])]


def run_fast(truth: Truth, method: str, mode: str, seed: int, trials: int) -> Run:
    """One study in-process through the real driver loop (bench/surfaces/fast.py)."""
    from fast import fast_study

    try:
        done, wall, winner = fast_study(overrides(truth, method, mode, seed, trials))
    except Exception as e:  # a failed study is a row with its error, not a lost bench
        return Run(truth.name, method, seed, 1, 0.0, (), None, f"{type(e).__name__}: {e}"[:200], mode, "fast")
    curve, found = curves_of(truth, [(t["params"], t["status"], t["metrics"]) for t in done])
    winner_ok, exported = winner_scores(truth, {t["number"]: t["params"] for t in done}, winner.get("number"),
                                        winner.get("remeasured", []))
    return Run(truth.name, method, seed, 0, wall, curve, winner_ok, "", mode, "fast", found, exported,
               winner.get("runs", 0))


_TRUTHS: dict[str, Truth] = {}  # filled before the fast studies' processes fork


def _label(method: str, variant: str) -> str:
    return f"{method}:{variant}" if variant and variant != "base" else method


_DEFAULTS: dict[tuple[str, str], object] = {}  # (module, attribute) -> its value before any variant


def set_variant(variant: str) -> None:
    """Set the module attributes of ``variant`` (VARIANTS; '' or 'base': the defaults), every other
    variant's attributes back to their defaults. Raises AttributeError for a knob that is gone."""
    import importlib

    def module_of(mod: str):  # a search module, or a surface's own (bench/surfaces/MOD.py)
        return importlib.import_module(mod if mod in SURFACE_MODULES else f"autotune.search.{mod}")

    for mods in VARIANTS.values():
        for mod, attrs in mods.items():
            module = module_of(mod)
            for k in attrs:
                if not hasattr(module, k):
                    raise AttributeError(f"{module.__name__} has no {k}")
                _DEFAULTS.setdefault((mod, k), getattr(module, k))
                setattr(module, k, _DEFAULTS[(mod, k)])
    for mod, attrs in VARIANTS.get(variant, {}).items():
        module = module_of(mod)
        for k, v in attrs.items():
            setattr(module, k, v)


def _job(job: tuple[str, str, str, int, str], trials: int, fast: bool, out: Path, family: bool = False) -> Run:
    name, method, mode, seed, variant = job
    if fast:
        set_variant(variant)
    run = _job_run((name, method, mode, seed), trials, fast, out, family)
    return replace(run, method=_label(method, variant))


def _job_run(job: tuple[str, str, str, int], trials: int, fast: bool, out: Path, family: bool = False) -> Run:
    name, method, mode, seed = job
    if family:  # instance = seed; its truth enumerated once per process
        if (name, seed) not in _TRUTHS:
            _TRUTHS[(name, seed)] = load(name, seed, launchable=False)
        truth = _TRUTHS[(name, seed)]
        if truth.optimum <= 0:  # a drawn instance where nothing is feasible: no score, left out
            return Run(name, method, seed, 0, 0.0, (), None, "no feasible configuration", mode, "fast")
    else:
        truth = _TRUTHS[name]
    return run_fast(truth, method, mode, seed, trials) if fast else run_study(truth, method, mode, seed, trials, out)


def run_study(truth: Truth, method: str, mode: str, seed: int, trials: int, out: Path) -> Run:
    """One study through the real CLI in a subprocess."""
    study_dir = out / truth.name / mode / method / f"s{seed}"
    if (study_dir / "summary.json").exists() and (study_dir / "cli.log").exists():
        return scored(truth, method, mode, seed, study_dir)  # done before
    shutil.rmtree(study_dir, ignore_errors=True)
    argv = [sys.executable, "-m", "autotune.cli", "run", "--config-dir", str(ROOT / "bench" / "surfaces"),
            f"study.name=eff_{truth.name}_{mode}_{method}_s{seed}", f"study.dir={study_dir}",
            "tracking.enabled=false", "report.enabled=false", "ray.num_cpus=1",
            *overrides(truth, method, mode, seed, trials)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_DEDUP_LOGS": "0", "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t0
    (study_dir).mkdir(parents=True, exist_ok=True)
    (study_dir / "cli.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    error = "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
    return scored(truth, method, mode, seed, study_dir, proc.returncode, wall, error)


def scored(truth: Truth, method: str, mode: str, seed: int, study_dir: Path, rc: int = 0, wall: float = 0.0,
           error: str = "") -> Run:
    """The :class:`Run` of a CLI study from its directory (:func:`score`)."""
    curve, winner_ok, exported = score(truth, study_dir)
    return Run(truth.name, method, seed, rc, wall, curve, winner_ok, error, mode, exported=exported)


def aggregate(runs: list[Run], truth: Truth) -> dict:
    ok = [r for r in runs if r.curve]
    first = runs[0]
    row = {"surface": truth.name, "set": first.set, "mode": first.mode, "method": first.method,
           "via": first.via, "seeds": len(runs), "failed": len(runs) - len(ok)}
    for n in CHECKPOINTS:
        row[f"at{n}"] = _median([r.at(n) for r in ok])
    hits = sum(r.trials_to(0.95) <= 20 for r in ok)
    row["reach95_by20"] = hits / max(len(ok), 1)
    scored = [r for r in ok if r.found]
    row["found95_by20"] = (sum(r.found[min(20, len(r.found)) - 1] >= 0.95 for r in scored) / len(scored)
                           if scored else math.nan)
    row["reach95_ci"] = wilson(hits, len(ok))
    to95 = sorted(r.trials_to(0.95) for r in ok)
    row["median_trials95"] = _median(to95)
    row["trials95_iqr"] = _quartiles(to95)
    judged = [r.winner_ok for r in ok if r.winner_ok is not None]
    row["winner_ok"] = sum(judged) / len(judged) if judged else math.nan
    exported = [r for r in ok if r.exported is not None]
    row["exported95"] = sum(r.exported >= 0.95 for r in exported) / len(exported) if exported else math.nan
    row["remeasure_runs"] = _median([r.remeasure_runs for r in exported]) if exported else math.nan
    row["launched"] = _median([len(r.curve) for r in ok])
    row["wall_s"] = _median([r.wall_s for r in runs])
    return row


def group(runs: list[Run], truths: dict[str, Truth]) -> list[dict]:
    """One row per surface x set x prior mode x method x how it ran, in a stable order."""
    order = {m: i for i, m in enumerate([*METHODS, *MODES])}
    keys = sorted({(r.surface, r.set, r.mode, r.method, r.via) for r in runs},
                  key=lambda k: (list(truths).index(k[0]), k[1], order.get(k[2], 99), order.get(k[3], 99), k[4]))
    return [aggregate([r for r in runs if (r.surface, r.set, r.mode, r.method, r.via) == k], truths[k[0]])
            for k in keys]


def paired(runs: list[Run], base: str = "default") -> list[str]:
    """The methods side by side on the same seeds (the timing noise is paired), one line per
    surface x set x prior mode x how it ran, against every other method (a METHODS name or a
    variant): :func:`stats.side_by_side` at 95% by trial 20; totals per way it ran (fast, cli:
    the same seeds run both ways are not pooled)."""
    kept = {((r.surface, r.set, r.mode, r.via), r.method, r.seed): r for r in runs
            if r.curve and (r.method == base or r.method in METHODS or ":" in r.method)}
    hits = {k: r.trials_to(0.95) <= 20 for k, r in kept.items()}
    best = {k: r.at(20) for k, r in kept.items()}
    area = {k: sum(map(r.at, range(1, 21))) / 20 for k, r in kept.items()}
    return [*side_by_side(hits, base, total_by=lambda cell: cell[3]),
            *shift(best, "share of the optimum at trial 20", base, lambda cell: cell[2]),
            *shift(area, "mean share over trials 1-20", base, lambda cell: cell[2])]


def table(rows: list[dict], truths: dict[str, Truth], runs: list[Run] = ()) -> str:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="search efficiency: true value of the best measured-feasible config / true optimum")
    for col in ("surface", "set", "prior", "method", "via", "seeds", "@10", "@20", "@30",
                "95% by 20 [Wilson 95%]", "found 95% by 20", "trials to 95% \\[quartiles]", "winner ok",
                "exported 95% (+runs)", "launched", "s/study"):
        t.add_column(col, justify="left" if col in ("surface", "set", "prior", "method", "via") else "right")
    for row in rows:
        lo, hi = row.get("reach95_ci", (math.nan, math.nan))
        q1, q3 = row.get("trials95_iqr", (math.nan, math.nan))
        t.add_row(row["surface"], row.get("set", ""), row.get("mode", "physics"), row["method"],
                  row.get("via", "cli"), str(row["seeds"]), *(f"{row[f'at{n}']:.3f}" for n in CHECKPOINTS),
                  f"{row['reach95_by20']:.0%} [{lo:.0%}, {hi:.0%}]",
                  "-" if math.isnan(row.get("found95_by20", math.nan)) else f"{row['found95_by20']:.0%}",
                  f"{_n(row['median_trials95'])} [{_n(q1)}, {_n(q3)}]",
                  "-" if math.isnan(row["winner_ok"]) else f"{row['winner_ok']:.0%}",
                  "-" if math.isnan(row.get("exported95", math.nan)) else
                  f"{row['exported95']:.0%} (+{row['remeasure_runs']:g})",
                  f"{row['launched']:g}", f"{row['wall_s']:.1f}" if row["wall_s"] else "-")
    for name, tr in truths.items():
        p = tr.n_launchable95 / tr.n_launchable  # refused proposals are re-asked, not counted
        t.add_row(name, "", "physics", "random*", "", "", "", "", "", f"{1 - (1 - p) ** 20:.0%}", "",
                  f"{math.log(2) / p:.0f}", "", "", "", "")
    console = Console(width=220, record=True)
    console.print(t)
    for name, tr in truths.items():
        console.print(f"{name}: {tr.n_configs} configs, {tr.n_launchable} launchable (no rule broken, "
                      f"not predicted OOM by the physics prior), {tr.n_feasible} feasible, {tr.n_within95} "
                      f"within 95% of the optimum {tr.optimum:.4g} {tr.metric}")
    exported = [r for r in runs if r.curve and r.exported is not None]
    if exported:
        console.print(f"\nthe pick at trial 20 (best measured feasible) within 95% of the optimum in "
                      f"{sum(r.at(20) >= 0.95 for r in exported)} of {len(exported)} studies; the winner "
                      f"exported after the end-of-study re-measurement in {sum(r.exported >= 0.95 for r in exported)} "
                      f"(median +{_median([r.remeasure_runs for r in exported]):g} launches)", soft_wrap=True)
    lines = paired(list(runs))
    if lines:
        console.print("\nside by side on the same seeds: studies where the default reached 95% by trial 20 and "
                      "the other method did not / the reverse", soft_wrap=True)
        for line in lines:
            console.print(line, soft_wrap=True)
    lines = verdicts(rows)
    if lines:
        console.print("\ntargets (issue 23) for the default:")
        for line in lines:
            console.print(line, soft_wrap=True)
    return console.export_text()


def write_results(results: Path | None, text: str, rows: list[dict], runs: list[Run], wall: float, cmd: str) -> None:
    if results is None:
        print("(nothing written: --results PATH keeps the table and every study)")
        return
    results.parent.mkdir(parents=True, exist_ok=True)
    results.with_suffix(".txt").write_text(text)
    results.with_suffix(".json").write_text(json.dumps(
        {"rows": rows, "runs": [asdict(r) for r in runs], "wall_s": wall, "command": cmd}, indent=1, default=str))


def load_runs(path: Path) -> list[Run]:
    """Runs from a results .json or a streamed .jsonl (one Run a line)."""
    text = path.read_text()
    items = json.loads(text)["runs"] if path.suffix == ".json" else [json.loads(x) for x in text.splitlines() if x]
    return [Run(**{**r, "curve": tuple(r["curve"]), "found": tuple(r.get("found") or ())}) for r in items]


def family_text(rows: list[dict], runs: list[Run]) -> str:
    """The family instances' table, then the methods side by side on the same instances."""
    lines = paired(runs)
    return instances.family_table(rows, {}) + (
        "\nside by side on the same instances (won/lost: reached 95% by trial 20 and the other did not):\n"
        + "\n".join(lines) + "\n" if lines else "")


def merge(files: list[Path], results: Path | None, cmd: str) -> int:
    """Re-aggregate the runs of earlier results files (later files win on the same study)."""
    runs: dict[tuple, Run] = {}
    for f in files:
        for run in load_runs(f):
            runs[(run.surface, run.mode, run.method, run.seed, run.via)] = run
    tail = f"\n{len(runs)} studies, {sum(len(r.curve) for r in runs.values())} launched trials\n$ {cmd}\n"
    if all(instances.split_of(r.seed) for r in runs.values()):  # family instances: their own table
        rows = instances.family_rows(sorted(runs.values(), key=lambda r: (FAMILIES.index(r.surface), r.mode)))
        text = family_text(rows, list(runs.values()))
        print(text + tail, end="")
        write_results(results, text + tail, rows, list(runs.values()), 0.0, cmd)
        return 0
    truths = {s: load(s) for s in dict.fromkeys(k[0] for k in runs)}
    text = table(group(list(runs.values()), truths), truths, list(runs.values()))
    print(tail, end="")
    write_results(results, text + tail, group(list(runs.values()), truths), list(runs.values()), 0.0, cmd)
    return 0


def smoke(truths: dict[str, Truth], seeds: int, trials: int) -> list[Run]:
    """In-process uniform random search on each surface's truth (no CLI, no engine): each seed
    draws launchable configurations in a seeded order, scored like a study. Checks the
    surfaces, the truth and the scoring in seconds; not a measurement of any sampler."""
    import random

    from truth import enumerate_space

    from autotune.engines.command import CommandEngine
    from autotune.search.rules import violations

    runs = []
    for name, truth in truths.items():
        settings = truth.preset["engine"]["settings"]
        launchable = [p for p in enumerate_space(truth.preset["space"]) if not violations(truth.rules, p)
                      and CommandEngine.predict(p, settings, {}).fits is not False]
        for seed in range(seeds):
            order = random.Random(seed).sample(launchable, min(trials, len(launchable)))
            best, curve = 0.0, []
            for p in order:
                best = max(best, truth.value(p))
                curve.append(min(best / truth.optimum, 1.0))
            runs.append(Run(name, "random", seed, 0, 0.0, tuple(curve), None, via="smoke"))
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--surfaces", default=",".join(SURFACES))
    ap.add_argument("--methods", default="default,random")
    ap.add_argument("--modes", default=",".join(MODES), help="prior modes: none, physics, misleading")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=REPORT_SEEDS[0],
                    help="seeds run are first-seed .. first-seed+seeds-1 (100-119: the report set)")
    ap.add_argument("--tune", action="store_true", help="the tune set: seeds 0-9 of TUNE_SURFACES")
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=1, help="studies run in parallel")
    ap.add_argument("--fast", action="store_true",
                    help="in-process studies through the real driver loop and sampler (no Ray, MLflow)")
    ap.add_argument("--variant", default="",
                    help="fast mode: sampler variants (VARIANTS), comma-separated, each run side by side on "
                         "the same studies ('base': the defaults); rows are labelled METHOD:VARIANT")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 surface, 2 methods, 1 seed, 6 trials")
    ap.add_argument("--out", default=None, help="where CLI studies go (default: a temp dir, removed)")
    ap.add_argument("--results", default=None,
                    help="results path without suffix: the table (.txt) and every study (.json) are written "
                         "there (default: printed only; bench/results/efficiency.txt is a log kept by hand, "
                         "so a run never writes over it unless named)")
    ap.add_argument("--stream", default=None, help="append each finished study to this .jsonl")
    ap.add_argument("--merge", nargs="+", metavar="FILE", help="no runs: table from .json/.jsonl results")
    ap.add_argument("--rescore", action="store_true",
                    help="no runs: score the finished studies already under --out")
    ap.add_argument("--smoke", action="store_true",
                    help="seconds, in-process, no CLI: random order on every surface's truth, scored "
                         "and tabled; writes nothing unless --results is given")
    ap.add_argument("--families", default="", help="issue 41: families (or 'all') run on instances")
    ap.add_argument("--split", default="tune", choices=list(instances.SPLITS),
                    help="--families: tune (instance seeds 1000-) or report (5000-, held out)")
    ap.add_argument("--skip", type=int, default=0,
                    help="--families: start after the split's first SKIP instances (fresh ones)")
    args = ap.parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]
    cmd = "python bench/efficiency.py " + " ".join(given)
    fams = [] if not args.families else FAMILIES if args.families == "all" else args.families.split(",")
    for f in fams:
        if f not in FAMILIES:
            ap.error(f"--families: unknown {f!r}; choose from all, {', '.join(FAMILIES)}")
    if args.smoke and fams:
        runs, shapes = instances.smoke_runs(fams, 3, args.trials, Run)
        print(instances.family_table(instances.family_rows(runs), shapes))
        return 0
    if args.smoke:
        names = [s for s in args.surfaces.split(",") if s]
        truths = {s: load(s) for s in names}
        runs = smoke(truths, min(args.seeds, 5), args.trials)
        rows = group(runs, truths)
        text = table(rows, truths, runs)
        if "--results" in given:
            write_results(Path(args.results), text, rows, runs, 0.0, cmd)
        return 0
    if args.merge:
        return merge([Path(p) for p in args.merge], Path(args.results) if args.results else None, cmd)
    if args.quick:
        args.surfaces, args.methods, args.modes, args.seeds, args.trials = "cpu_7b", "default,random", "physics", 1, 6
    if args.tune:
        args.surfaces, args.first_seed, args.seeds = ",".join(TUNE_SURFACES), 0, 10
    surfaces = [s for s in args.surfaces.split(",") if s]
    methods = [m for m in args.methods.split(",") if m]
    modes = [m for m in args.modes.split(",") if m]
    for m in methods:
        if m not in METHODS:
            ap.error(f"--methods: unknown {m!r}; choose from {', '.join(METHODS)}")
    for m in modes:
        if m not in MODES:
            ap.error(f"--modes: unknown {m!r}; choose from {', '.join(MODES)}")
    if fams:
        surfaces, args.first_seed = fams, instances.SPLITS[args.split][0] + args.skip  # --seeds: instances a family
    truths = {s: load(s, launchable=not fams) for s in surfaces}
    variants = [v for v in args.variant.split(",") if v] or [""]
    for v in variants:
        if v not in ("", "base", *VARIANTS):
            ap.error(f"--variant: unknown {v!r}; choose from base, {', '.join(VARIANTS)}")
        if v and not args.fast:
            ap.error("--variant: only with --fast (the CLI runs the product's defaults)")
        try:
            set_variant(v)
        except AttributeError as e:  # a knob the sampler no longer has: no silent no-op
            ap.error(f"--variant {v}: {e}")
    set_variant("")
    import tempfile

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="autotune-eff-"))
    # seeds outermost: a bench cut short still has every row on the same seeds
    jobs = [(truths[s], m, mode, seed, v) for seed in range(args.first_seed, args.first_seed + args.seeds)
            for s in surfaces for mode in modes for m in methods for v in variants]
    stream = Path(args.stream) if args.stream else None
    if stream and stream.exists():  # resume: the studies already streamed are kept, not re-run
        done = {(r.surface, r.mode, r.method, r.seed) for r in load_runs(stream)}
        jobs = [j for j in jobs if (j[0].name, j[2], _label(j[1], j[4]), j[3]) not in done]

    t0 = time.monotonic()
    if args.rescore:
        runs = [scored(t, m, mode, seed, out / t.name / mode / m / f"s{seed}")
                for t, m, mode, seed in jobs if (out / t.name / mode / m / f"s{seed}" / "summary.json").exists()]
    else:
        # CLI studies are subprocesses already; fast ones share Hydra's global state, so each
        # runs in a forked process of its own (inheriting the variant's module attributes)
        _TRUTHS.update(truths)
        executor = ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("fork")) \
            if args.fast else ThreadPoolExecutor(args.jobs)
        runs = []
        with executor:
            work = partial(_job, trials=args.trials, fast=args.fast, out=out, family=bool(fams))
            for run in executor.map(work, [(t.name, m, mode, seed, v) for t, m, mode, seed, v in jobs]):
                if stream:
                    with stream.open("a") as f:
                        f.write(json.dumps(asdict(run)) + "\n")
                runs.append(run)
    wall = time.monotonic() - t0
    rows = group(runs, truths)
    text = family_text(instances.family_rows(runs), runs) if fams else table(rows, truths, runs)
    if fams:
        print(text)
    tail = f"\n{len(runs)} studies, {sum(len(r.curve) for r in runs)} launched trials in {wall:.0f} s\n$ {cmd}\n"
    tail += "".join(f"study {r.surface}/{r.mode}/{r.method}/s{r.seed} exited {r.rc}: {r.error}\n"
                    for r in runs if r.rc != 0)
    print(tail, end="")
    write_results(Path(args.results) if args.results else None, text + tail, rows, runs, wall, cmd)
    if not args.out and not args.rescore:
        shutil.rmtree(out, ignore_errors=True)
    return 0 if all(r.rc == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
