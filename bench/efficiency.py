"""How fast each search method finds the true feasible optimum, through the real CLI.

Each study is ``autotune run --config-dir bench/surfaces conf=SURFACE ...`` in its own
process: the real driver, Optuna storage, Ray placement and trial workers, with the
``kind: command`` engine running ``bench/surfaces/sim.py`` (a simulated engine with 3%
log-normal timing noise). The bench knows each surface's noise-free truth
(bench/surfaces/truth.py enumerates the whole space), so it scores a study by the TRUE value
of the configuration the study would pick after n launched trials (best measured
feasible), divided by the true feasible optimum.

Per surface and method, over seeds: median best-so-far / optimum at 10, 20 and 30 launched
trials, the share of seeds reaching 95% by 20, the median number of trials to reach 95%,
and the share of seeds whose exported winner is the true best of the re-measured
candidates. ``random*`` is the analytic median for uniform random sampling (ln 2 / p, p =
share of the launchable configurations, those neither breaking a rule nor predicted OOM,
within 95% of the optimum).

    python bench/efficiency.py                         # 4 surfaces x 5 methods x 10 seeds
    python bench/efficiency.py --quick                 # 1 surface, 2 methods through the CLI
    python bench/efficiency.py --smoke                 # seconds: in-process random on the truths
    python bench/efficiency.py --surfaces exl2_70b --methods default,random --seeds 5 --jobs 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "surfaces"))
sys.path.insert(0, str(ROOT))

from truth import Truth  # noqa: E402
from truth import load  # noqa: E402
from truth import satisfies  # noqa: E402

SURFACES = ("exl2_70b", "streamer_70b", "llamacpp_7b", "cpu_7b")
METHODS = {  # name -> overrides on top of the preset (the preset leaves the defaults alone)
    "default": [],
    "random": ["study.sampler=random"],
    "tpe": ["study.sampler=tpe"],
    "tpe_pareto": ["study.sampler=tpe", "study.search=pareto"],
    "gp": ["study.sampler=gp"],  # Optuna's GPSampler after the design (the default before bo)
    "grid": ["study.sampler=grid"],
    # prior mode "none" (issue 23): the preset without its predict block, as a user of a custom
    # engine would run it; the bench surfaces' predict blocks carry simulator constants
    "default_noprior": ["~engine.settings.predict"],
    "random_noprior": ["study.sampler=random", "~engine.settings.predict"],
}
CHECKPOINTS = (10, 20, 30)
RESULTS = ROOT / "bench" / "results"


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


def score(truth: Truth, study_dir: Path) -> tuple[tuple[float, ...], bool | None]:
    """Best-so-far curve over launched trials and whether the exported winner is right."""
    best_measured, best_true, curve = -math.inf, 0.0, []
    params_of: dict[int, dict] = {}
    for d in sorted((study_dir / "trials").glob("[0-9]*")):
        spec, result = _read(d / "spec.json"), _read(d / "result.json")
        if not spec:
            continue
        params_of[int(spec["number"])] = spec["params"]
        metrics = result.get("metrics") or {}
        if result.get("status") == "ok" and satisfies(metrics, truth.constraints):
            if metrics[truth.metric] > best_measured:
                best_measured, best_true = metrics[truth.metric], truth.credit(spec["params"])
        curve.append(min(best_true / truth.optimum, 1.0))
    summary = _read(study_dir / "summary.json")
    winner = (summary.get("winner") or {}).get("number")
    by_trial = ((summary.get("remeasured") or {}).get("by_trial") or {})
    candidates = [int(n) for n in by_trial if int(n) in params_of]
    winner_ok = None
    if winner is not None and candidates:
        values = {n: truth.credit(params_of[n]) for n in candidates}
        winner_ok = values.get(int(winner), truth.credit(params_of.get(int(winner), {}))) >= 0.995 * max(values.values())
    return tuple(curve), winner_ok


def run_study(truth: Truth, method: str, seed: int, trials: int, out: Path) -> Run:
    """One study through the real CLI in a subprocess."""
    study_dir = out / truth.name / method / f"s{seed}"
    if (study_dir / "summary.json").exists() and (study_dir / "cli.log").exists():
        return Run(truth.name, method, seed, 0, 0.0, *score(truth, study_dir))  # done before
    shutil.rmtree(study_dir, ignore_errors=True)
    argv = [sys.executable, "-m", "autotune.cli", "run", "--config-dir", str(ROOT / "bench" / "surfaces"),
            f"conf={truth.name}", f"study.name=eff_{truth.name}_{method}_s{seed}",
            f"study.dir={study_dir}", f"study.seed={seed}", f"study.n_trials={trials}",
            "tracking.enabled=false", "report.enabled=false", "ray.num_cpus=1", *METHODS[method]]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_DEDUP_LOGS": "0", "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t0
    (study_dir).mkdir(parents=True, exist_ok=True)
    (study_dir / "cli.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    curve, winner_ok = score(truth, study_dir)
    error = "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
    return Run(truth.name, method, seed, proc.returncode, wall, curve, winner_ok, error)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def wilson(hits: int, n: int) -> tuple[float, float]:
    """The Wilson 95% interval of a share of ``hits`` in ``n`` seeds (scipy)."""
    from scipy.stats import binomtest

    if n == 0:
        return (math.nan, math.nan)
    ci = binomtest(hits, n).proportion_ci(confidence_level=0.95, method="wilson")
    return (float(ci.low), float(ci.high))


def _quartiles(values: list[float]) -> tuple[float, float]:
    """Lower and upper quartile (inclusive method; inf where a seed never got there)."""
    if len(values) < 2:
        return (values[0], values[0]) if values else (math.nan, math.nan)
    v = sorted(values)

    def q(f: float) -> float:
        x = f * (len(v) - 1)
        lo, hi, f = v[math.floor(x)], v[math.ceil(x)], x - math.floor(x)
        return lo if f == 0 or lo == hi else math.inf if math.isinf(hi) else lo + (hi - lo) * f
    return (q(0.25), q(0.75))


def _n(x: float) -> str:
    return ">budget" if math.isinf(x) else f"{x:g}"


def aggregate(runs: list[Run], truth: Truth) -> dict:
    ok = [r for r in runs if r.curve]
    row = {"surface": truth.name, "method": runs[0].method, "seeds": len(runs), "failed": len(runs) - len(ok)}
    for n in CHECKPOINTS:
        row[f"at{n}"] = _median([r.at(n) for r in ok])
    hits = sum(r.trials_to(0.95) <= 20 for r in ok)
    row["reach95_by20"] = hits / max(len(ok), 1)
    row["reach95_ci"] = wilson(hits, len(ok))
    to95 = sorted(r.trials_to(0.95) for r in ok)
    row["median_trials95"] = _median(to95)
    row["trials95_iqr"] = _quartiles(to95)
    judged = [r.winner_ok for r in ok if r.winner_ok is not None]
    row["winner_ok"] = sum(judged) / len(judged) if judged else math.nan
    row["launched"] = _median([len(r.curve) for r in ok])
    row["wall_s"] = _median([r.wall_s for r in runs])
    return row


def table(rows: list[dict], truths: dict[str, Truth]) -> str:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="search efficiency: true value of the best measured-feasible config / true optimum")
    for col in ("surface", "method", "seeds", "@10", "@20", "@30", "95% by 20 [Wilson 95%]",
                "trials to 95% \\[quartiles]", "winner ok", "launched", "s/study"):
        t.add_column(col, justify="left" if col in ("surface", "method") else "right")
    for row in rows:
        lo, hi = row.get("reach95_ci", (math.nan, math.nan))
        q1, q3 = row.get("trials95_iqr", (math.nan, math.nan))
        t.add_row(row["surface"], row["method"], str(row["seeds"]),
                  *(f"{row[f'at{n}']:.3f}" for n in CHECKPOINTS),
                  f"{row['reach95_by20']:.0%} [{lo:.0%}, {hi:.0%}]",
                  f"{_n(row['median_trials95'])} [{_n(q1)}, {_n(q3)}]",
                  "-" if math.isnan(row["winner_ok"]) else f"{row['winner_ok']:.0%}",
                  f"{row['launched']:g}", f"{row['wall_s']:.0f}" if row["wall_s"] else "-")
    for name, tr in truths.items():
        p = tr.n_launchable95 / tr.n_launchable  # refused proposals are re-asked, not counted
        t.add_row(name, "random*", "", "", "", "", f"{1 - (1 - p) ** 20:.0%}", f"{math.log(2) / p:.0f}", "",
                  "", "")
    console = Console(width=170, record=True)
    console.print(t)
    for name, tr in truths.items():
        console.print(f"{name}: {tr.n_configs} configs, {tr.n_launchable} launchable (no rule broken, "
                      f"not predicted OOM), {tr.n_feasible} feasible, {tr.n_within95} within 95% of "
                      f"the optimum {tr.optimum:.4g} {tr.metric}")
    return console.export_text()


def write_results(results: Path, text: str, rows: list[dict], runs: list[Run], wall: float, cmd: str) -> None:
    results.parent.mkdir(parents=True, exist_ok=True)
    results.with_suffix(".txt").write_text(text)
    results.with_suffix(".json").write_text(json.dumps(
        {"rows": rows, "runs": [asdict(r) for r in runs], "wall_s": wall, "command": cmd}, indent=1, default=str))


def merge(files: list[Path], results: Path, cmd: str) -> int:
    """Re-aggregate the runs of earlier results files (later files win on the same study)."""
    runs: dict[tuple, Run] = {}
    commands, wall = [], 0.0
    for f in files:
        data = json.loads(f.read_text())
        commands.append(data.get("command", ""))
        wall += float(data.get("wall_s", 0.0))
        for r in data["runs"]:
            run = Run(**{**r, "curve": tuple(r["curve"])})
            runs[(run.surface, run.method, run.seed)] = run
    surfaces = list(dict.fromkeys(k[0] for k in runs))
    methods = [m for m in METHODS if any(k[1] == m for k in runs)]
    truths = {s: load(s) for s in surfaces}
    rows = [aggregate([r for r in runs.values() if r.surface == s and r.method == m], truths[s])
            for s in surfaces for m in methods if any(k[:2] == (s, m) for k in runs)]
    text = table(rows, truths)
    tail = f"\n{len(runs)} studies, {sum(len(r.curve) for r in runs.values())} launched trials, {wall:.0f} s of runs\n"
    tail += "".join(f"$ {c}\n" for c in commands) + f"$ {cmd}\n"
    print(tail, end="")
    write_results(results, text + tail, rows, list(runs.values()), wall, cmd)
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
            runs.append(Run(name, "random", seed, 0, 0.0, tuple(curve), None))
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--surfaces", default=",".join(SURFACES))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0,
                    help="seeds run are first-seed .. first-seed+seeds-1 (--merge pools runs by seed)")
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=2, help="studies run in parallel")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 surface, 2 methods, 1 seed, 8 trials")
    ap.add_argument("--out", default=None, help="where the studies go (default: a temp dir, removed)")
    ap.add_argument("--results", default=str(RESULTS / "efficiency"), help="results path without suffix")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="no runs: table from earlier results files")
    ap.add_argument("--rescore", action="store_true",
                    help="no runs: score the finished studies already under --out")
    ap.add_argument("--smoke", action="store_true",
                    help="seconds, in-process, no CLI: random order on every surface's truth, scored "
                         "and tabled; writes nothing unless --results is given")
    args = ap.parse_args(argv)
    cmd = "python bench/efficiency.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.smoke:
        names = [s for s in args.surfaces.split(",") if s]
        truths = {s: load(s) for s in names}
        runs = smoke(truths, min(args.seeds, 5), args.trials)
        rows = [aggregate([r for r in runs if r.surface == s], truths[s]) for s in names]
        text = table(rows, truths)
        if "--results" in (argv if argv is not None else sys.argv[1:]):
            write_results(Path(args.results), text, rows, runs, 0.0, cmd)
        return 0
    if args.merge:
        return merge([Path(p) for p in args.merge], Path(args.results), cmd)
    if args.quick:
        args.surfaces, args.methods, args.seeds, args.trials = "cpu_7b", "default,random", 1, 8
    surfaces = [s for s in args.surfaces.split(",") if s]
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        if m not in METHODS:
            ap.error(f"--methods: unknown {m!r}; choose from {', '.join(METHODS)}")
    truths = {s: load(s) for s in surfaces}
    import tempfile

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="autotune-eff-"))
    jobs = [(truths[s], m, seed) for seed in range(args.first_seed, args.first_seed + args.seeds)
            for s in surfaces for m in methods]
    t0 = time.monotonic()
    if args.rescore:
        runs = [Run(t.name, m, seed, 0, 0.0, *score(t, out / t.name / m / f"s{seed}"))
                for t, m, seed in jobs if (out / t.name / m / f"s{seed}" / "summary.json").exists()]
    else:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            runs = list(pool.map(lambda j: run_study(*j, args.trials, out), jobs))
    wall = time.monotonic() - t0
    rows = [aggregate([r for r in runs if r.surface == s and r.method == m], truths[s])
            for s in surfaces for m in methods if any(r.surface == s and r.method == m for r in runs)]
    text = table(rows, truths)
    tail = f"\n{len(runs)} studies, {sum(len(r.curve) for r in runs)} launched trials in {wall:.0f} s\n$ {cmd}\n"
    tail += "".join(f"study {r.surface}/{r.method}/s{r.seed} exited {r.rc}: {r.error}\n"
                    for r in runs if r.rc != 0)
    print(tail, end="")
    text += tail
    write_results(Path(args.results), text, rows, runs, wall, cmd)
    if not args.out and not args.rescore:
        shutil.rmtree(out, ignore_errors=True)
    return 0 if all(r.rc == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
