"""Async refill vs batch-synchronous trials on 1, 2 and 4 fake GPU slots (real Ray, real driver).

Each trial is the command engine running ``python -c "sleep(d); print(metrics)"`` with
``d`` drawn uniformly from [0.5, 1.5] s (a 3x spread) by a seeded random sampler, so both
modes run the same durations in the same order. A trial reserves 1 fake GPU of a local Ray
started with ``num_gpus=N``; the full per-trial cost is included: Ray worker start, the
``autotune.trial.worker`` subprocess, the command subprocess, SQLite tells.

- async: the real :class:`autotune.run.driver.Driver` loop (refill as soon as one finishes).
- batch: ask N, run N, wait for all N, tell them (what the Hydra Optuna sweeper does),
  built from the same driver methods so only the scheduling differs.
Both use the real Placement, whose Ray workers are reused across trials (``max_calls=0``).

Run: ``python bench/parallel.py [--repeats 3] [--per-slot 6] [--out bench/results/parallel.txt]``.
Wall time is the ask/tell loop only (study creation and export excluded), median of the
repeats with the min-max spread; efficiency = throughput(N) / (N * throughput(1)), with
throughput(1) of the async loop.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray on 127.0.0.1 only
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, installed or not

from rich.console import Console  # noqa: E402

from autotune.config.compose import compose  # noqa: E402
from autotune.config.schema import load_config  # noqa: E402
from autotune.config.validate import compile_space  # noqa: E402
from autotune.output.report import Reporter  # noqa: E402
from autotune.record.optuna_study import n_finished  # noqa: E402
from autotune.run.driver import Driver  # noqa: E402
from autotune.run.placement import Placement  # noqa: E402

CODE = ("import time,json,sys; d=float(sys.argv[1]); time.sleep(d); "
        "print(json.dumps(dict(decode_tps=100.0/d, ttft_p95_ms=10.0*d)))")


def bench_config(study_dir: Path, n_trials: int, seed: int, slots: int):
    data = compose([f"ray.max_concurrent={slots}",
        "conf=command_example", f"study.dir={study_dir}", f"study.n_trials={n_trials}",
        f"study.seed={seed}", "study.sampler=random", "tracking.enabled=false",
        "select.top_k=0", "constraints=[]", "study.trial_timeout_s=60",
    ])
    data["engine"]["settings"].update({
        "argv": ["{python}", "-c", CODE, "{duration_s}"],
        "knobs": {"duration_s": {"type": "float", "low": 0.5, "high": 1.5}},
        "defaults": {"duration_s": 1.0},
        "resources": {"num_cpus": 1, "num_gpus": 1},
        "env": {}, "timeout_s": 60, "quality_knobs": None,  # the example's knob is gone
    })
    data["space"] = {"duration_s": {"type": "float", "low": 0.5, "high": 1.5}}
    data["rules"] = []
    cfg = load_config(data)
    return cfg, compile_space(cfg)


class TimedDriver(Driver):
    """The real driver; records the wall time of its ask/tell loop."""

    def _loop(self, study, t0: float) -> None:
        start = time.monotonic()
        super()._loop(study, t0)
        self.loop_s = time.monotonic() - start


class BatchDriver(TimedDriver):
    """Ask N, run N, wait for all N, tell all N: the batch-synchronous sweeper's schedule."""

    def _loop(self, study, t0: float) -> None:
        start = time.monotonic()
        self.pending = {}
        slots = self.cfg.ray.max_concurrent
        while n_finished(study) < self.cfg.study.n_trials:
            want = min(slots, self.cfg.study.n_trials - n_finished(study))
            while len(self.pending) < want:
                self._ask_one(study)
            refs = list(self.pending)
            self.placement.ray.wait(refs, num_returns=len(refs), timeout=600)
            for ref in refs:
                p = self.pending.pop(ref)
                self._finish_one(study, p, self.placement.result(ref, p.trial.number))
        self.loop_s = time.monotonic() - start


def run_once(slots: int, mode: str, n_trials: int, seed: int, root: Path) -> tuple[float, float]:
    """(loop wall s, median per-trial runner duration s) of one study."""
    import optuna

    study_dir = root / f"{mode}-{slots}-{seed}"
    cfg, space = bench_config(study_dir, n_trials, seed, slots)
    cls = BatchDriver if mode == "batch" else TimedDriver
    placement = Placement(cfg.ray)
    driver = cls(cfg, space, placement, None, Reporter(cfg, Console(file=io.StringIO())))
    summary = driver.run()
    study = optuna.load_study(study_name=cfg.study.name, storage=cfg.storage_url)
    durations = [t.user_attrs.get("duration_s", 0.0) for t in study.trials]
    failed = summary.n_failed
    if failed:
        raise RuntimeError(f"{failed} trial(s) failed in {study_dir}")
    return driver.loop_s, statistics.median(durations)


def main(argv: list[str] | None = None) -> int:
    import ray

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--per-slot", type=int, default=6, help="trials per slot in one study")
    ap.add_argument("--out", default=None,
                    help="results file (default bench/results/parallel.txt; none with --smoke)")
    ap.add_argument("--smoke", action="store_true",
                    help="seconds: slots 1 and 2, one repeat, 2 trials per slot (the test suite runs it)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.slots, args.repeats, args.per_slot = [1, 2], 1, 2
    elif args.out is None:
        args.out = "bench/results/parallel.txt"
    rows, lines = [], []
    base_tph: dict[str, float] = {}  # throughput of the async loop on 1 slot
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="atbench") as tmp:
        for slots in args.slots:
            ray.init(address="local", num_cpus=max(8, 2 * slots), num_gpus=slots, include_dashboard=False,
                     log_to_driver=False, logging_level="ERROR")
            try:
                n = args.per_slot * slots
                for mode in ("async", "batch") if slots > 1 else ("async",):
                    walls, per_trial = [], []
                    for rep in range(args.repeats):
                        wall, med = run_once(slots, mode, n, seed=rep, root=Path(tmp))
                        walls.append(wall)
                        per_trial.append(med)
                        print(f"  slots={slots} {mode} repeat {rep}: {wall:.1f} s", flush=True)
                    wall = statistics.median(walls)
                    tph = n / wall * 3600
                    if slots == 1:
                        base_tph["async"] = tph
                    rows.append((slots, mode, n, wall, min(walls), max(walls), tph,
                                 tph / (slots * base_tph["async"]), statistics.median(per_trial)))
            finally:
                ray.shutdown()
    head = (f"{'slots':>5} {'mode':>6} {'trials':>6} {'wall s':>7} {'spread s':>11} "
            f"{'trials/h':>9} {'effic.':>6} {'trial s':>7}")
    lines += [head, "-" * len(head)]
    for s, m, n, w, lo, hi, tph, eff, med in rows:
        lines.append(f"{s:>5} {m:>6} {n:>6} {w:>7.1f} {lo:>5.1f}-{hi:<5.1f} {tph:>9.0f} "
                     f"{eff:>6.2f} {med:>7.2f}")
    by = {(r[0], r[1]): r for r in rows}
    for s in args.slots:
        if (s, "batch") in by:
            a, b = by[(s, "async")], by[(s, "batch")]
            lines.append(f"slots={s}: async {a[6] / b[6]:.2f}x the throughput of batch")
    lines.append("sleep per trial: uniform 0.5-1.5 s (mean 1.0 s); 'trial s' = median runner-measured "
                 "trial time (sleep + worker/command subprocess overhead)")
    lines.append(f"median of {args.repeats} repeats, spread = min-max; benchmark took "
                 f"{time.monotonic() - t_start:.0f} s on {os.cpu_count()} cores")
    text = "\n".join(lines)
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
