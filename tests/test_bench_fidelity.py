"""bench/fidelity.py's contamination check: a trial's CPU is the bench's own, an outsider's is not.

The trial runner's worker ends its whole process group with one SIGKILL, so the worker (the
engine) and the guard die before a parent waits for them. The bench once let init reap them
and counted their CPU as another process's: every autotune measurement was dropped as
contaminated. Here a real ``run_trial`` of the fake engine burns CPU (``burn_cpu_s``) in a
process acting as the bench; a busy loop started beside it (by this test, not in its tree)
is the outsider. The machine is shared, so the verdict is judged on these controlled
processes only: the "machine" is the trial's worker CPU (as the worker itself reports it)
plus the loop's (read from /proc over the window), and ``others_busy`` is the share of it
the bench does not count as its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import fidelity  # noqa: E402

THRESHOLD = 0.10  # the bench's default --threshold
BURN_S = 1.0

# The bench's side: measure_clean (the bench's own function, threshold 1: never re-run) around
# a real run_trial, snapshots before and after; the loop's CPU read from /proc/PID/stat.
BENCH_ROLE = """
import json, sys, tempfile
sys.path.insert(0, "bench")
import fidelity
from autotune.trial import TrialSpec, run_trial

loop = int(sys.argv[1])

def loop_jiffies():
    if not loop:
        return 0
    fields = open(f"/proc/{loop}/stat").read().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime + stime

with tempfile.TemporaryDirectory() as tmp:
    spec = TrialSpec(number=0, engine="fake", settings={}, variants={},
                     params={"burn_cpu_s": float(sys.argv[2]), "gpus": 0},
                     workload={"prompts": "short", "max_tokens": 8, "warmup": 0, "repeats": 1},
                     quality={"enabled": False}, timeout_s=120, workdir=tmp)
    a, la = fidelity.cpu_snap(), loop_jiffies()
    result = fidelity.measure_clean(lambda: run_trial(spec), 1, 0.0, 1.0)[0]
    b, lb = fidelity.cpu_snap(), loop_jiffies()
print(json.dumps({"status": result.status, "reason": result.reason,
                  "worker": result.info.get("cpu_s", 0.0) * fidelity.HZ,
                  "own": b[2] - a[2], "loop": lb - la}))
"""


def _bench_role(loop_pid: int = 0) -> dict:
    proc = subprocess.run([sys.executable, "-c", BENCH_ROLE, str(loop_pid), str(BURN_S)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["status"] == "ok", out
    assert out["worker"] >= BURN_S * fidelity.HZ, out  # the fake burned what it was told
    return out


def _judge(out: dict) -> float:
    """``others_busy`` over the controlled processes: the trial's worker and the loop."""
    machine = out["worker"] + out["loop"]
    return fidelity.others_busy((0, 0, 0), (machine, machine, out["own"]))


def test_a_trials_cpu_is_the_benchs_own_and_judged_clean():
    out = _bench_role()
    assert out["own"] >= out["worker"] - 2, out  # the engine's CPU reached the bench
    assert _judge(out) <= THRESHOLD, out


def test_a_busy_loop_outside_the_benchs_tree_is_judged_contaminated():
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        out = _bench_role(loop.pid)
    finally:
        loop.kill()
        loop.wait()
    assert out["loop"] >= 0.2 * fidelity.HZ, out  # the outsider ran during the window
    assert out["own"] < out["worker"] + 0.5 * out["loop"], out  # and is nobody's own
    assert _judge(out) > THRESHOLD, out


def _rows(decode: float) -> list[dict]:
    return [{"decode_tps": decode, "prefill_tps": 500.0, "ttft_ms": 100.0}] * 3


@pytest.mark.parametrize("case, results, own, expect", [
    ("kept", {"c": {"autotune": [_rows(50.0)], "direct": [_rows(51.0)]}},
     {"c": {"autotune": [2.0], "direct": [1.8]}}, None),
    ("all dropped", {"c": {"autotune": [], "direct": [_rows(51.0)]}},
     {"c": {"autotune": [2.0], "direct": [1.8]}}, "every autotune measurement was left out"),
    ("nan", {"c": {"autotune": [_rows(float("nan"))], "direct": [_rows(51.0)]}},
     {"c": {"autotune": [2.0], "direct": [1.8]}}, "decode tok/s: the ratio is nan"),
    ("trial not own", {"c": {"autotune": [_rows(50.0)], "direct": [_rows(51.0)]}},
     {"c": {"autotune": [0.05], "direct": [1.8]}}, "a trial's own CPU (0.05 s)"),
])
def test_the_bench_names_what_makes_its_table_worthless(case, results, own, expect):
    got = fidelity.problems(results, own)
    if expect is None:
        assert got == []
    else:
        assert len(got) == 1 and expect in got[0], got
