"""Parallel slots: trials and wall time to 95% of the true optimum, 1 slot vs N (``bo``).

Each study is the real :class:`autotune.run.driver.Driver` (its refill loop, refusals,
duplicates, startup design, real Optuna storage and the real ``bo`` sampler, asked while
other trials are RUNNING) on a bench surface, with a placement that runs no process: a
trial's metrics are the surface's noise-free truth (``bench/surfaces/truth.py``) with 3%
log-normal timing noise that depends only on the surface, the seed and the configuration
(paired across slot counts and acquisitions), and its duration is simulated from them:

    duration = LOAD_S + (warmup + repeats) * (TTFT + max_tokens / decode speed)

with the preset's workload (1 warmup + 5 repeats of 64 tokens), ``LOAD_S`` (20 s) alone for
a launch that fails (OOM, crash). Trials finish in simulated-time order and a freed slot is
refilled at once, as ``ray.max_concurrent`` slots would be.

Simplified against Ray: no worker or subprocess start, every slot identical and always
free when the driver asks, the sampler's own time and the tells take no simulated time,
and no trial times out. The acquisition for trials in flight (``autotune.search.bo.BATCH``:
believer, fantasy, penalize) is set per study with ``--batch``.

Scored like bench/efficiency.py: after k trials have finished (in finishing order), the true
value of the best measured-feasible configuration over the true feasible optimum. Per
surface, acquisition and slot count: median trials to 95% [quartiles] (">budget" when not
reached in the budget), the share that reached it, the median simulated wall time to 95%
and for the whole budget, and the ratios N-slot / 1-slot of the medians; the ``all`` rows
pool the trials of every surface, and give the geometric mean of the surfaces' wall ratios.

    python bench/slots.py                                  # seeds 100-119, 4 surfaces
    python bench/slots.py --seeds 10 --first-seed 0 --batch believer,fantasy,penalize
    python bench/slots.py --smoke                          # seconds: 1 surface, 1 seed
"""

from __future__ import annotations

import argparse
import io
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SURFACE_DIR = ROOT / "bench" / "surfaces"
sys.path.insert(0, str(SURFACE_DIR))
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from sim import with_noise  # noqa: E402
from truth import Truth  # noqa: E402
from truth import load  # noqa: E402
from truth import satisfies  # noqa: E402

from autotune.config.compose import compose  # noqa: E402
from autotune.config.schema import load_config  # noqa: E402
from autotune.config.validate import compile_space  # noqa: E402
from autotune.output.report import Reporter  # noqa: E402
from autotune.run.driver import Driver  # noqa: E402
from autotune.search import bo  # noqa: E402
from autotune.search.batch import MODES  # noqa: E402
from autotune.search.design import config_key  # noqa: E402
from autotune.trial.spec import TrialResult  # noqa: E402

SURFACES = ("exl2_70b", "streamer_70b", "llamacpp_7b", "cpu_7b")
RESULTS = ROOT / "bench" / "results" / "slots.txt"
LOAD_S = 20.0


@dataclass
class Finished:
    """One trial as the driver saw it finish (simulated seconds since the study began)."""

    at_s: float
    number: int
    params: dict[str, Any]
    result: TrialResult


class SimPlacement:
    """The driver's placement in simulated time: ``submit`` computes the trial's result and
    finishing time at once; ``wait`` advances the clock to the earliest trial in flight."""

    def __init__(self, truth: Truth, seed: int, slots: int, workload: Any) -> None:
        self.truth, self.seed, self.slots, self.workload = truth, seed, slots, workload
        self.now = 0.0
        self.flight: dict[int, tuple[float, dict[str, Any], TrialResult]] = {}
        self.log: list[Finished] = []

    def capacity(self) -> dict[str, float]:
        return {"CPU": 1e6, "GPU": float(self.slots)}

    def default_slots(self) -> int:
        return self.slots

    def fits(self, res: Any) -> str:
        return ""

    def measure(self, number: int, params: dict[str, Any]) -> TrialResult:
        """The surface's metrics with paired noise, and the simulated duration."""
        _, metrics, why = self.truth.evaluate(params)
        if metrics is None:
            return TrialResult(number, "failed", reason=why, duration_s=LOAD_S)
        metrics = with_noise(metrics, self.truth.name, f"{self.truth.name}|{self.seed}|{config_key(params)}")
        w = self.workload
        per = metrics["ttft_p50_ms"] / 1000 + w.max_tokens / max(metrics["decode_tps"], 1e-9)
        return TrialResult(number, "ok", metrics, duration_s=LOAD_S + (w.warmup + w.repeats) * per)

    def submit(self, spec: Any, res: Any) -> int:
        result = self.measure(spec.number, spec.params)
        self.flight[spec.number] = (self.now + result.duration_s, spec.params, result)
        return spec.number

    def _done(self, ref: int) -> int:
        at, params, result = self.flight[ref]
        self.log.append(Finished(at, ref, params, result))
        return ref

    def wait(self, refs: list, timeout_s: float) -> list:
        first = min(refs, key=lambda r: (self.flight[r][0], r))
        self.now = max(self.now, self.flight[first][0])
        return [self._done(first)]

    def wait_all_done(self, refs: list) -> list:
        return [self._done(r) for r in sorted(refs) if self.flight[r][0] <= self.now]

    def result(self, ref: int, number: int) -> TrialResult:
        return self.flight.pop(ref)[2]

    def cancel(self, ref: int) -> None:
        self.flight.pop(ref, None)

    def stop_all(self, refs: list) -> None:
        for ref in refs:
            self.cancel(ref)

    def run_now(self, spec: Any, res: Any) -> TrialResult:
        raise RuntimeError("slots bench: no re-measurement (select.top_k=0) and no quality reference")

    def shutdown(self) -> None:
        return None


@dataclass(frozen=True)
class Run:
    """One study's best-so-far curve by finished trials, and when each trial finished."""

    surface: str
    batch: str
    slots: int
    seed: int
    curve: tuple[float, ...]
    times: tuple[float, ...]
    ask_s: float  # the sampler's real seconds per ask (median), for the record

    def trials_to(self, level: float = 0.95) -> float:
        return next((i + 1 for i, r in enumerate(self.curve) if r >= level), math.inf)

    def wall_to(self, level: float = 0.95) -> float:
        n = self.trials_to(level)
        return math.inf if math.isinf(n) else self.times[int(n) - 1]


def score(truth: Truth, log: list[Finished]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    best_measured, best_true, curve, times = -math.inf, 0.0, [], []
    for f in log:
        m = f.result.metrics
        if f.result.status == "ok" and satisfies(m, truth.constraints) and m[truth.metric] > best_measured:
            best_measured, best_true = m[truth.metric], truth.credit(f.params)
        curve.append(min(best_true / truth.optimum, 1.0))
        times.append(f.at_s)
    return tuple(curve), tuple(times)


class TimedPoolDriver(Driver):
    """The real driver; records the sampler's wall seconds per ask."""

    def _ask_one(self, study):
        t = time.perf_counter()
        why = super()._ask_one(study)
        self.ask_s.append(time.perf_counter() - t)
        return why


def run_study(truth: Truth, batch: str, slots: int, seed: int, trials: int, prior: str, tmp: Path) -> Run:
    overrides = [f"conf={truth.name}", f"study.dir={tmp / f'{truth.name}-{batch}-{slots}-{seed}'}",
                 f"study.name=slots_{truth.name}_{batch}_{slots}_{seed}", f"study.seed={seed}",
                 f"study.n_trials={trials}", "study.sampler=bo", f"ray.max_concurrent={slots}",
                 "tracking.enabled=false", "report.enabled=false", "select.top_k=0"]
    if prior == "none":
        overrides.append("~engine.settings.predict")
    cfg = load_config(compose(overrides, config_dir=str(SURFACE_DIR)))
    placement = SimPlacement(truth, seed, slots, cfg.workload)
    bo.BATCH = batch
    driver = TimedPoolDriver(cfg, compile_space(cfg), placement, None,
                             Reporter(cfg, Console(file=io.StringIO())))
    driver.ask_s = []
    driver.run()
    curve, times = score(truth, placement.log)
    return Run(truth.name, batch, slots, seed, curve, times, statistics.median(driver.ask_s or [0.0]))


def _quartiles(v: list[float]) -> tuple[float, float]:
    v = sorted(v)
    if len(v) < 2:
        return (v[0], v[0]) if v else (math.nan, math.nan)

    def q(f: float) -> float:
        x = f * (len(v) - 1)
        lo, hi = v[math.floor(x)], v[math.ceil(x)]
        return lo if lo == hi or x == math.floor(x) else math.inf if math.isinf(hi) else lo + (hi - lo) * (x - math.floor(x))
    return q(0.25), q(0.75)


def _n(x: float, fmt: str = "g") -> str:
    return ">budget" if math.isinf(x) else format(x, fmt)


def _ratio(a: float, b: float) -> str:
    if math.isinf(a) or math.isinf(b) or math.isnan(b) or not b:
        return "-"
    return f"{a / b:.2f}"


def table(runs: list[Run], slot_counts: list[int]) -> list[str]:
    """Per surface: medians and N-slot / 1-slot ratios of the medians. The ``all`` rows pool
    the trials over surfaces; their wall ratios are the geometric mean of the surfaces'
    (hours on different surfaces do not pool)."""
    head = (f"{'surface':<13} {'batch':<9} {'slots':>5} {'seeds':>5} {'trials to 95% [quartiles]':>26} "
            f"{'reached':>7} {'wall to 95% h':>13} {'budget wall h':>13} {'x trials':>8} {'/ wall':>6} "
            f"{'/ budget':>8} {'s/ask':>5}")
    lines = [head, "-" * len(head)]
    groups = list(dict.fromkeys((r.surface, r.batch) for r in runs))
    ratios: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for surface, batch in groups + [("all", b) for b in dict.fromkeys(r.batch for r in runs)]:
        base = (math.nan,) * 3
        for slots in slot_counts:
            rs = [r for r in runs if (surface == "all" or r.surface == surface) and r.batch == batch
                  and r.slots == slots]
            if not rs:
                continue
            n95 = [r.trials_to() for r in rs]
            med_n = statistics.median(n95)
            med_w = statistics.median(r.wall_to() / 3600 for r in rs)
            med_b = statistics.median(r.times[-1] / 3600 for r in rs)
            if slots == 1:
                base = (med_n, med_w, med_b)
            q1, q3 = _quartiles(n95)
            if surface == "all":
                per = ratios.get((batch, slots), [])
                gm = [math.exp(statistics.fmean(math.log(x[i]) for x in per)) if per else math.nan
                      for i in (0, 1)]
                walls = f"{'-':>13} {'-':>13} {_ratio(med_n, base[0]) if slots != 1 else '-':>8} "
                walls += f"{_ratio(gm[0], 1.0) if slots != 1 else '-':>6} {_ratio(gm[1], 1.0) if slots != 1 else '-':>8}"
            else:
                rw = med_w / base[1] if slots != 1 and math.isfinite(med_w) and math.isfinite(base[1]) else None
                if rw is not None:
                    ratios.setdefault((batch, slots), []).append((rw, med_b / base[2]))
                walls = (f"{_n(med_w, '.2f'):>13} {med_b:>13.2f} {_ratio(med_n, base[0]) if slots != 1 else '-':>8} "
                         f"{_ratio(med_w, base[1]) if slots != 1 else '-':>6} "
                         f"{_ratio(med_b, base[2]) if slots != 1 else '-':>8}")
            lines.append(
                f"{surface:<13} {batch:<9} {slots:>5} {len(rs):>5} "
                f"{_n(med_n) + ' [' + _n(q1) + ', ' + _n(q3) + ']':>26} "
                f"{sum(not math.isinf(x) for x in n95) / len(rs):>7.0%} {walls} "
                f"{statistics.median(r.ask_s for r in rs):>5.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--surfaces", default=",".join(SURFACES))
    ap.add_argument("--batch", default="believer,fantasy,penalize",
                    help=f"acquisitions for trials in flight, comma-separated ({', '.join(MODES)})")
    ap.add_argument("--slots", default="1,4", help="slot counts; 1 (sequential) is the reference")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=100, help="report on 100-119; tune on 0-9")
    ap.add_argument("--trials", type=int, default=30, help="launched trials per study (the budget)")
    ap.add_argument("--prior", choices=("preset", "none"), default="preset",
                    help="the preset's predict block, or none (as for a custom engine)")
    ap.add_argument("--out", type=Path, default=None, help=f"write the table here (default {RESULTS})")
    ap.add_argument("--json", type=Path, default=None, help="also write every run's curve here")
    ap.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                    help="no runs: one table from the --json files of earlier runs")
    ap.add_argument("--smoke", action="store_true",
                    help="seconds: cpu_7b, seed 0, 10 trials, fantasy, writes nothing")
    args = ap.parse_args(argv)
    cmd = "python bench/slots.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.smoke:
        args.surfaces, args.batch, args.seeds, args.first_seed, args.trials = "cpu_7b", "fantasy", 1, 0, 10
    batches = [b for b in args.batch.split(",") if b]
    for b in batches:
        if b not in MODES:
            ap.error(f"--batch: unknown {b!r}; choose from {', '.join(MODES)}")
    slot_counts = sorted({int(s) for s in args.slots.split(",")} | {1})
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.monotonic()
    runs: list[Run] = []
    if args.merge:
        data = [json.loads(f.read_text()) for f in args.merge]
        runs = [Run(**{**r, "curve": tuple(r["curve"]), "times": tuple(r["times"])})
                for d in data for r in d["runs"]]
        slot_counts = sorted({r.slots for r in runs})
        cmd = "\n".join([*(f"$ {d['command']}" for d in data), f"$ {cmd}"])[2:]
    with tempfile.TemporaryDirectory(prefix="atslots") as tmp:
        for name in [] if args.merge else [s for s in args.surfaces.split(",") if s]:
            truth = load(name)
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                seq = run_study(truth, batches[0], 1, seed, args.trials, args.prior, Path(tmp))
                # with 1 slot nothing is in flight at an ask: every acquisition is the same study
                runs += [Run(seq.surface, b, 1, seed, seq.curve, seq.times, seq.ask_s) for b in batches]
                for batch in batches:
                    for slots in slot_counts[1:]:
                        runs.append(run_study(truth, batch, slots, seed, args.trials, args.prior, Path(tmp)))
                r = runs[-1]
                print(f"  {name} seed {seed}: 1 slot {_n(seq.trials_to())} trials, "
                      f"{slot_counts[-1]} slots ({r.batch}) {_n(r.trials_to())} "
                      f"[{time.monotonic() - t0:.0f} s]", flush=True)
    seeds = sorted({r.seed for r in runs})
    lines = [f"bo with {', '.join(map(str, slot_counts))} slots, prior {args.prior}, "
             f"{max((len(r.curve) for r in runs), default=0)} trials, seeds {', '.join(map(str, seeds))}; "
             "simulated time (bench/slots.py)",
             *table(runs, slot_counts),
             "trials to 95%: finished trials until the best measured-feasible is truly >= 95% of the optimum;",
             "x trials, / wall, / budget: N-slot median over the 1-slot median (same seeds, paired noise);",
             "budget wall: simulated hours until every trial of the budget finished; s/ask: sampler, real.",
             f"{len(runs)} rows in {time.monotonic() - t0:.0f} s", f"$ {cmd}"]
    text = "\n".join(lines)
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps({"command": cmd, "runs": [asdict(r) for r in runs]}))
    out = args.out or (None if args.smoke else RESULTS)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
