"""The default sampler's own cost: seconds per ask against the number of trials told.

An in-process ask/tell loop of ``study.sampler: bo`` (:class:`autotune.search.bo.PoolSampler`)
on a real Optuna study, told through :func:`autotune.record.optuna_study.tell` (the driver's own
path), over a synthetic command-engine space of ``--size`` configurations (default 100,000:
four knobs, one of them a ten-way choice) with a TTFT constraint and a speed prior for every
configuration. No engine runs: each trial's metrics are a known function of its
configuration with 3% noise, so what is timed is the sampler alone (the ask, which scores the
pool). Every ``--every``-th ask is timed; the trials between are random pool configurations,
enqueued and told, so 1,000 trials take minutes. Prints, per window of trials, the median,
p90 and max wall seconds per ask and the median CPU seconds (the sampler's own work, whatever
else the machine runs), and writes bench/results/sampler_cost.txt.

    python bench/sampler_cost.py                  # 1,000 trials on 100k configurations
    python bench/sampler_cost.py --smoke          # 20 trials on 2,000 configurations (seconds)
    python bench/sampler_cost.py --trials 300 --out /tmp/cost.txt
    python bench/sampler_cost.py --pareto         # bo's Pareto search: decode up, TTFT down
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.config.schema import load_config  # noqa: E402
from autotune.config.validate import compile_space  # noqa: E402
from autotune.record import optuna_study as studylib  # noqa: E402
from autotune.search.bo import PoolSampler  # noqa: E402
from autotune.search.pool import build_pool  # noqa: E402
from autotune.trial.spec import TrialResult  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "sampler_cost.txt"
RESULTS_PARETO = ROOT / "bench" / "results" / "sampler_cost_pareto.txt"
MODES = [f"m{i}" for i in range(10)]


def config(a_high: int, pareto: bool = False):
    """A command-engine config of ``(a_high + 1) * 20 * 10 * 10`` configurations (``pareto``:
    a Pareto search of decode speed against TTFT)."""
    knobs = {"a": {"type": "int", "low": 0, "high": a_high}, "b": {"type": "int", "low": 0, "high": 19},
             "c": {"type": "int", "low": 0, "high": 9}, "mode": {"type": "str", "choices": MODES}}
    return load_config({
        "engine": {"kind": "command", "settings": {"argv": ["x", "{a}"], "knobs": knobs,
                                                   "defaults": {"a": 0, "b": 0, "c": 0, "mode": "m0"}}},
        "space": {"a": {"type": "int", "low": 0, "high": a_high}, "b": {"type": "int", "low": 0, "high": 19},
                  "c": {"type": "int", "low": 0, "high": 9},
                  "mode": {"type": "categorical", "choices": MODES}},
        "objectives": ["decode_tps", "ttft_p95_ms"] if pareto else ["decode_tps"],
        "constraints": ["ttft_p95_ms <= 400"], "quality": {"enabled": False},
        "study": {"sampler": "bo", "search": "pareto" if pareto else "single"},
    })


def truth(p: dict, a_high: int) -> tuple[float, float]:
    """(decode tokens/s, TTFT ms): a smooth bump in (a, b), a choice and a TTFT wall in c."""
    a, b = p["a"] / max(a_high, 1), p["b"] / 19
    tps = 40 * math.exp(-4 * (a - 0.7) ** 2 - 3 * (b - 0.4) ** 2) + 3 * MODES.index(p["mode"]) % 7 + p["c"]
    return tps + 5, 100 + 40 * p["c"] + 100 * a


def bound(p: dict, a_high: int) -> float:
    """A loose prior: right in a and c, blind to b and the choice."""
    return 60 * math.exp(-3 * (p["a"] / max(a_high, 1) - 0.6) ** 2) + 2 * p["c"] + 20


def run(size: int, trials: int, seed: int, cap_s: float, every: int,
        pareto: bool = False) -> list[tuple[int, float, float]]:
    """(trials told before the ask, wall seconds, CPU seconds of that ask) for each timed ask.

    Only every ``every``-th trial is asked of the sampler and timed; the others are pool
    configurations drawn at random, enqueued and told (the sampler skips an enqueued trial),
    so a long study is reached quickly. What an ask costs depends on what was told, not on
    who chose it."""
    a_high = max(1, size // 2000) - 1
    cfg = config(a_high, pareto)
    space = compile_space(cfg)
    t0 = time.perf_counter()
    pool = build_pool(space, lambda p: (True, bound(p, a_high)), seed)
    print(f"pool: {len(pool.keys)} configurations, {pool.X.shape[1]} features, "
          f"built in {time.perf_counter() - t0:.1f} s", flush=True)
    sampler = PoolSampler(space, lambda: pool, cfg.constraints, seed, n_startup=8,
                          objectives=studylib.told_names(cfg))
    study = optuna.create_study(directions=studylib.directions(cfg), sampler=sampler)
    rng = np.random.default_rng(seed)
    out = []
    dt = 0.0
    for n in range(trials):
        timed = n < 8 or n % every == every - 1
        if not timed:
            study.enqueue_trial(pool.params[int(rng.integers(len(pool.params)))])
        t, c = time.perf_counter(), time.process_time()
        trial = study.ask()
        params = space.suggest(trial)
        if timed:
            dt = time.perf_counter() - t
            out.append((n, dt, time.process_time() - c))
        tps, ttft = truth(params, a_high)
        noise = math.exp(rng.normal(0, 0.03))
        studylib.tell(study, trial, cfg, params, TrialResult(
            trial.number, "ok", {"decode_tps": tps * noise, "ttft_p95_ms": ttft / noise}))
        if (n + 1) % 50 == 0:
            print(f"  {n + 1} trials, last ask {dt:.3f} s", flush=True)
        if dt > cap_s:
            print(f"  stopped: one ask took {dt:.1f} s (> --cap {cap_s} s)", flush=True)
            break
    return out


def table(times: list[tuple[int, float, float]], window: int) -> list[str]:
    """One row per window of trials: wall seconds per ask (median, p90, max), CPU median."""
    lines = [f"{'trials told':>14}  {'median s/ask':>12}  {'p90 s/ask':>10}  {'max':>7}  {'CPU median':>10}"]
    for lo in range(0, times[-1][0] + 1, window):
        w = [dt for n, dt, _ in times if lo <= n < lo + window]
        cpu = [c for n, _, c in times if lo <= n < lo + window]
        if w:
            lines.append(f"{lo:>6}-{lo + window - 1:<7}  {np.median(w):>12.3f}  "
                         f"{np.percentile(w, 90):>10.3f}  {max(w):>7.3f}  {np.median(cpu):>10.3f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=100_000, help="configurations in the space (x2,000)")
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--window", type=int, default=100, help="trials per row of the curve")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every", type=int, default=10,
                    help="time every Nth ask; the trials between are random pool configurations")
    ap.add_argument("--cap", type=float, default=60.0, help="stop once one ask takes longer (s)")
    ap.add_argument("--smoke", action="store_true", help="20 trials on 2,000 configurations (seconds)")
    ap.add_argument("--pareto", action="store_true", help="a Pareto search over decode speed and TTFT")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"write the curve here (default {RESULTS}, or {RESULTS_PARETO.name} with --pareto)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.size, args.trials, args.window, args.every = 2000, 20, 5, 1
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.perf_counter()
    times = run(args.size, args.trials, args.seed, args.cap, args.every, args.pareto)
    load = os.getloadavg()[0]
    lines = [f"bo{' (Pareto search: decode_tps up, ttft_p95_ms down)' if args.pareto else ''}, seconds per ask: {args.size:,}-configuration space, {args.trials} trials "
             f"({f'every {args.every}th asked and timed' if args.every > 1 else 'every ask timed'}, "
             f"{len(times)} asks timed), "
             f"seed {args.seed}, {time.perf_counter() - t0:.0f} s in all, load average at the end "
             f"{load:.1f} on {os.cpu_count()} cores", *table(times, args.window)]
    print("\n".join(lines))
    out = args.out or (None if args.smoke else RESULTS_PARETO if args.pareto else RESULTS)
    if out is not None:
        out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
