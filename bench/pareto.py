"""How much of the true feasible Pareto front each sampler finds, on the bench surfaces.

For each surface the bench searches two objectives that trade off there (``decode_tps`` up
and, per surface, VRAM, quality loss or TTFT down; ``PAIRS``), under the preset's own
constraints, with ``study.search: pareto``. It knows each surface's noise-free truth
(bench/surfaces/truth.py enumerates the whole space), so it computes the true feasible
Pareto front and scores a study after n launched trials by the hypervolume of its
measured-feasible front (each configuration counted at its TRUE objectives, and only if it is
truly feasible within the timing noise) as a share of the true front's hypervolume. The
reference point is the worst value of each objective over the truly feasible configurations,
so every feasible configuration adds a non-negative area; the hypervolume is exact in 2-D
(Optuna's is private in 5.0).

Each study is an in-process ask/tell loop with the real pieces of ``autotune run``: the
preset composed by Hydra and validated, the compiled space, ``make_sampler``, the startup
design in front of the model-based samplers, trial 0 = the engine's defaults, refusals
(rules, predicted not to fit) and repeats told and re-asked without counting, and every
result told through ``autotune.record.optuna_study.tell`` (constraints via ``trial.set_constraint``,
crashes as the worst values seen with a violated ``run_ok``). The simplification against the
CLI: no Ray, no trial subprocess, no storage file; a trial's metrics are the surface model's
own, with the simulator's 3% log-normal timing noise drawn here, seeded by (surface,
configuration, seed), so noise is paired across methods. Under a second per study for TPE,
NSGA-II and random, 3-14 s for the default and 30-70 s for Optuna's GPSampler on two shared
cores (bench/results/pareto.txt, s/study).

Per surface and method over seeds: median hypervolume share at 10, 20 and 30 launched
trials, the share of seeds at >= 90% by trial 20 with its Wilson 95% interval, and the median
share at 20 [quartiles].

    python bench/pareto.py                               # 6 surfaces x every method, seeds 100-119
    python bench/pareto.py --smoke                       # seconds: one surface, a few trials
    python bench/pareto.py --surfaces cpu_7b --methods default,tpe --first-seed 0 --seeds 10
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SURFACE_DIR = ROOT / "bench" / "surfaces"
sys.path.insert(0, str(SURFACE_DIR))
sys.path.insert(0, str(ROOT))

from sim import with_noise  # noqa: E402
from stats import _quartiles  # noqa: E402
from stats import side_by_side  # noqa: E402
from stats import wilson  # noqa: E402
from truth import Truth  # noqa: E402
from truth import load  # noqa: E402
from truth import satisfies  # noqa: E402

PAIRS = {  # surface -> the objective traded against decode_tps (the richest true front there)
    "exl2_70b": "vram_peak_gb",  # 7 points on the true feasible front
    "streamer_70b": "ppl_delta_pct",  # 4
    "llamacpp_7b": "vram_peak_gb",  # 20
    "cpu_7b": "ttft_p95_ms",  # 2
    "vllm_h100": "ttft_p95_ms",  # 62 (throughput against latency along the memory ridge)
    "llamacpp_noisy": "vram_peak_gb",  # 16 (llamacpp_7b's front under 10% noise and a crash region)
}
METHODS = {"default": "auto", "bo": "bo", "gp": "gp", "tpe": "tpe", "nsga2": "nsga2", "random": "random"}
CHECKPOINTS = (10, 20, 30)
TARGET = 0.90
MARGIN = 0.1  # the reference point lies 10% of each objective's feasible range beyond its worst


def hypervolume(points: list[tuple[float, float]], ref: tuple[float, float]) -> float:
    """Exact 2-D hypervolume of ``points`` (both objectives minimised) up to ``ref``."""
    hv, floor = 0.0, ref[1]
    for a, b in sorted(p for p in points if p[0] < ref[0] and p[1] < ref[1]):
        if b < floor:
            hv += (ref[0] - a) * (floor - b)
            floor = b
    return hv


@dataclass
class Surface:
    """A surface's truth, its objective pair, the reference point and the true front's HV."""

    truth: Truth
    second: str
    ref: tuple[float, float]
    true_hv: float
    front: list[tuple[float, float]]

    def point(self, metrics: dict) -> tuple[float, float]:
        """The objectives as minimised: (-decode_tps, second)."""
        return (-metrics["decode_tps"], metrics[self.second])


def surface(name: str) -> Surface:
    from truth import enumerate_space

    truth = load(name)
    second = PAIRS[name]
    feasible = []
    for params in enumerate_space(truth.preset["space"]):
        value, metrics, _ = truth.evaluate(params)
        if value > 0:
            feasible.append((-metrics["decode_tps"], metrics[second]))
    worst = (max(p[0] for p in feasible), max(p[1] for p in feasible))
    best = (min(p[0] for p in feasible), min(p[1] for p in feasible))
    ref = tuple(w + MARGIN * (w - b) for w, b in zip(worst, best))
    front = [p for p in feasible if not any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in feasible)]
    return Surface(truth, second, ref, hypervolume(feasible, ref), sorted(set(front)))


@functools.cache
def truth_of(name: str) -> Truth:
    """The surface's truth, enumerated once per process."""
    return load(name)


@functools.cache
def config(name: str, method: str, trials: int):
    """The preset as ``autotune run`` would load it for a Pareto search with ``method``."""
    from autotune.config.compose import compose
    from autotune.config.schema import load_config

    data = compose([f"conf={name}", "study.search=pareto", f"study.sampler={METHODS[method]}",
                    f"study.n_trials={trials}", f"objectives=[decode_tps,{PAIRS[name]}]",
                    "tracking.enabled=false", "report.enabled=false"], str(SURFACE_DIR))
    return load_config(data)


def measure(truth: Truth, params: dict, seed: int):
    """The surface model's metrics with 3% log-normal timing noise (as bench/surfaces/sim.py)."""
    from autotune.search.design import config_key
    from autotune.trial.spec import TrialResult

    value, metrics, why = truth.evaluate(params)
    if metrics is None:
        return TrialResult(0, "failed", reason=why)
    return TrialResult(0, "ok", with_noise(metrics, truth.name, f"{truth.name}|{config_key(params)}|{seed}"))


def study(name: str, method: str, seed: int, trials: int, fast_part: float | None = None) -> dict:
    """One in-process Pareto study; the launched trials' params and measured results."""
    import optuna

    from autotune.config.validate import compile_space
    from autotune.record import optuna_study as studylib
    from autotune.search import trials as trialslib
    from autotune.search.design import FAST_PART
    from autotune.search.design import config_key
    from autotune.search.design import default_n_startup
    from autotune.search.design import startup_design
    from autotune.search.pool import build_pool
    from autotune.search.pool import uses_order
    from autotune.search.samplers import make_sampler
    from autotune.search.samplers import resolve
    from autotune.search.samplers import uses_design
    from autotune.search.space import baseline_params

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore")
    cfg = config(name, method, trials)
    cfg = dataclasses.replace(cfg, study=dataclasses.replace(cfg.study, seed=seed))
    truth = truth_of(name)
    space = compile_space(cfg)
    st = cfg.study
    n_startup = default_n_startup(trials)
    t0 = time.monotonic()

    def predict(params):
        return space.engine.predict(params, cfg.engine.settings, cfg.engine.variants)

    def screen(params):
        pred = predict(params)
        return pred.fits is not False, pred.decode_tps_upper

    sampler = make_sampler(st.sampler, seed, space, trials, n_startup, st.search,
                           pool=lambda: build_pool(space, screen, seed, ordered=uses_order(st.search),
                                                     expect=lambda p: dict(predict(p).expect)),
                           constraints=cfg.constraints,
                           objectives=studylib.told_names(cfg))
    s = optuna.create_study(directions=studylib.directions(cfg), sampler=sampler)
    baseline = baseline_params(space, cfg.engine.variants)
    design = []
    if uses_design(st.sampler):
        part = FAST_PART[resolve(st.sampler, st.search, len(cfg.objectives))] if fast_part is None else fast_part
        design = startup_design(space, n_startup - 1, seed, [baseline], screen, part)
    studylib.enqueue_initial(s, space, baseline, [], design)
    measured: dict[str, object] = {}
    launched: list[dict] = []
    refused = 0
    from autotune.trial.spec import TrialResult

    while len(launched) < trials and refused < 20 * trials:
        trial = s.ask()
        params = space.suggest(trial)
        reasons = space.violations(params)
        pred = None if reasons else predict(params)
        if reasons or pred.fits is False:
            why = "rule: " + "; ".join(reasons) if reasons else (pred.reason or "predicted not to fit")
            studylib.tell(s, trial, cfg, params, TrialResult(trial.number, "infeasible", reason=why),
                          kind=trialslib.REJECTED)
            refused += 1
            continue
        key = config_key(params)
        if key in measured:
            done = measured[key]
            studylib.tell(s, trial, cfg, params, dataclasses.replace(done, number=trial.number),
                          kind=trialslib.DUPLICATE)
            refused += 1
            continue
        result = dataclasses.replace(measure(truth, params, seed), number=trial.number)
        studylib.tell(s, trial, cfg, params, result)
        measured[key] = result
        launched.append({"params": params, "status": result.status, "metrics": result.metrics})
        refused = 0
    return {"surface": name, "method": method, "seed": seed, "launched": launched,
            "asks": len(s.trials), "wall_s": time.monotonic() - t0}


def curve(sf: Surface, run: dict) -> list[float]:
    """HV share of the true front after each launched trial."""
    points, out = [], []
    for t in run["launched"]:
        params, metrics = t["params"], t["metrics"]
        if t["status"] == "ok" and satisfies(metrics, sf.truth.constraints) and sf.truth.credit(params) > 0:
            points.append(sf.point(sf.truth.evaluate(params)[1]))
        out.append(hypervolume(points, sf.ref) / sf.true_hv)
    return out


def at(c: list[float], n: int) -> float:
    return c[min(n, len(c)) - 1] if c else 0.0


def aggregate(surface_name: str, method: str, curves: list[list[float]], walls: list[float]) -> dict:
    a20 = [at(c, 20) for c in curves]
    hits = sum(v >= TARGET for v in a20)
    return {"surface": surface_name, "method": method, "seeds": len(curves),
            **{f"at{n}": statistics.median(at(c, n) for c in curves) for n in CHECKPOINTS},
            "reach90_by20": hits / len(curves), "reach90_ci": wilson(hits, len(curves)),
            "median20": statistics.median(a20), "q20": _quartiles(a20),
            "wall_s": statistics.median(walls)}


def table(rows: list[dict], surfaces: dict[str, Surface], hits: dict | None = None) -> str:
    """The table, each surface's true front and, given ``hits`` ((surface,), method, seed) ->
    reached 90% by trial 20, the methods side by side on the same seeds."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Pareto search: hypervolume of the measured-feasible front / the true feasible front's")
    for col in ("surface", "objectives", "method", "seeds", "@10", "@20", "@30",
                ">=90% by 20 [Wilson 95%]", "@20 median \\[quartiles]", "s/study"):
        t.add_column(col, justify="left" if col in ("surface", "objectives", "method") else "right")
    for r in rows:
        lo, hi = r["reach90_ci"]
        q1, q3 = r["q20"]
        obj = f"decode_tps, {PAIRS[r['surface']]}" if r["surface"] in PAIRS else ""
        t.add_row(r["surface"], obj, r["method"], str(r["seeds"]), *(f"{r[f'at{n}']:.3f}" for n in CHECKPOINTS),
                  f"{r['reach90_by20']:.0%} [{lo:.0%}, {hi:.0%}]", f"{r['median20']:.3f} [{q1:.3f}, {q3:.3f}]",
                  f"{r['wall_s']:.1f}")
    console = Console(width=170, record=True)
    console.print(t)
    for name, sf in surfaces.items():
        front = ", ".join(f"({-a:.3g}, {b:.3g})" for a, b in sf.front)
        console.print(f"{name}: {sf.truth.n_feasible} feasible of {sf.truth.n_configs}; true front "
                      f"(decode_tps, {sf.second}): {front}; reference point ({-sf.ref[0]:.3g}, {sf.ref[1]:.3g})")
    lines = side_by_side(hits or {})
    if lines:
        console.print(f"\nside by side on the same seeds: studies where the default reached {TARGET:.0%} of the "
                      "true front's hypervolume by trial 20 and the other method did not / the reverse", soft_wrap=True)
        for line in lines:
            console.print(line, soft_wrap=True)
    return console.export_text()


def summarise(scored: list[dict]) -> tuple[list[dict], dict]:
    """The table's rows (each surface x method, then every surface pooled when there are
    several) and the side-by-side hits (reached ``TARGET`` by trial 20) of scored studies:
    dicts with surface, method, seed, curve and wall_s."""
    names = list(dict.fromkeys(r["surface"] for r in scored))
    methods = list(dict.fromkeys(r["method"] for r in scored))
    groups = [(n, m, [r for r in scored if (r["surface"], r["method"]) == (n, m)]) for n in names for m in methods]
    if len(names) > 1:
        groups += [("all", m, [r for r in scored if r["method"] == m]) for m in methods]
    rows = [aggregate(n, m, [r["curve"] for r in mine], [r["wall_s"] for r in mine]) for n, m, mine in groups if mine]
    hits = {((r["surface"],), r["method"], r["seed"]): at(r["curve"], 20) >= TARGET for r in scored}
    return rows, hits


def rescore(paths: list[Path]) -> int:
    """Print the table of results .json files (their stored curves, pooled) again, with the
    side-by-side counts."""
    saved = [json.loads(p.read_text()) for p in paths]
    curves = [c for s in saved for c in s["curves"]]
    rows, hits = summarise(curves)
    names = list(dict.fromkeys(r["surface"] for r in curves))
    table(rows, {n: surface(n) for n in names}, hits)  # the console prints it
    print(f"\n{len(curves)} studies rescored from {', '.join(map(str, paths))} "
          f"({'; '.join(s['command'] for s in saved)})")
    return 0


def _job(args: tuple) -> dict:
    run = study(*args)
    print(f"  {run['surface']}/{run['method']}/s{run['seed']}: {len(run['launched'])} launched, "
          f"{run['asks']} asks, {run['wall_s']:.1f} s", file=sys.stderr, flush=True)
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--surfaces", default=",".join(PAIRS))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=100, help="report on 100..119; tune on 0..9")
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=1, help="studies run in parallel (processes)")
    ap.add_argument("--results", default=None,
                    help="results path without suffix: the table (.txt) and every curve (.json) are written there "
                         "(default: printed only; bench/results/pareto.txt is a log kept by hand, and --rescore "
                         "reads the .json files it cites, so a run never writes over them unless named)")
    ap.add_argument("--fast-part", type=float, default=None,
                    help="exploring: the design's share from the fastest-predicted third (default: "
                         "design.FAST_PART of the sampler, 1.0 for gp and tpe)")
    ap.add_argument("--rescore", metavar="JSON", nargs="+", default=None,
                    help="no runs: print the table of results .json files again, their studies "
                         "pooled (with today's table code)")
    ap.add_argument("--smoke", action="store_true",
                    help="seconds: streamer_70b, default/tpe/random, 1 seed, 10 trials; writes nothing")
    args = ap.parse_args(argv)
    cmd = "python bench/pareto.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.rescore:
        return rescore([Path(p) for p in args.rescore])
    if args.smoke:
        args.surfaces, args.methods, args.seeds, args.trials = "streamer_70b", "default,tpe,random", 1, 10
    names = [s for s in args.surfaces.split(",") if s]
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        if m not in METHODS:
            ap.error(f"--methods: unknown {m!r}; choose from {', '.join(METHODS)}")
    for n in names:
        if n not in PAIRS:
            ap.error(f"--surfaces: unknown {n!r}; choose from {', '.join(PAIRS)}")
    surfaces = {n: surface(n) for n in names}
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    jobs = [(n, m, seed, args.trials, args.fast_part) for n in names for m in methods for seed in seeds]
    def label(m: str) -> str:
        return m if args.fast_part is None or m in ("random", "nsga2") else f"{m} fast={args.fast_part:g}"

    t0 = time.monotonic()
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            runs = list(pool.map(_job, jobs))
    else:
        runs = [_job(j) for j in jobs]
    wall = time.monotonic() - t0
    scored = [{"surface": r["surface"], "method": r["method"], "seed": r["seed"],
               "curve": curve(surfaces[r["surface"]], r), "wall_s": r["wall_s"], "asks": r["asks"]} for r in runs]
    rows, hits = summarise([{**r, "method": label(r["method"])} for r in scored])
    text = table(rows, surfaces, hits)
    tail = f"\n{len(runs)} studies, seeds {seeds.start}-{seeds.stop - 1}, {wall:.0f} s\n$ {cmd}\n"
    print(tail, end="")
    if args.results is None and not args.smoke:
        print("(nothing written: --results PATH keeps the table and every curve)")
    if args.results is not None and not args.smoke:
        out = Path(args.results)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".txt").write_text(text + tail)
        out.with_suffix(".json").write_text(json.dumps(
            {"command": cmd, "rows": rows, "curves": scored}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
