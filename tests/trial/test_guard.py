"""A trial whose worker is SIGKILLed from outside leaves nothing behind.

When a Ray worker exits (its driver was killed), Ray SIGKILLs that worker's direct children.
The runner's direct child is the guard's stub (autotune.trial.guard); the guard below it sees
the runner go (EOF on a pipe) and kills the whole group: here a fake engine's child that
ignores SIGTERM, standing in for an engine's server. Real processes, no Ray needed: the test
does what Ray does, in every order seen in the soak.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from autotune.engines.fake import read_records
from autotune.trial import TrialSpec
from tests.helpers.procs import children
from tests.helpers.procs import group_members
from tests.helpers.procs import process_alive

pytestmark = pytest.mark.slow

RUNNER = ("import sys; from pathlib import Path; from autotune.trial import TrialSpec, run_trial; "
          "run_trial(TrialSpec.from_json(Path(sys.argv[1]).read_text()))")


def _wait(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


@pytest.mark.parametrize("victims", [
    ("stub",),  # Ray's KillChildProcs; the runner lives on and kills the group itself
    ("runner",),  # a SIGKILLed Ray worker whose child Ray did not reach
    ("runner", "stub"),  # both: only the guard is left to act
    ("worker", "runner", "stub"),  # the worker crashed and the guard was draining when Ray went
])
def test_killing_the_runner_or_its_child_stops_the_whole_trial(tmp_path, victims):
    records = tmp_path / "records"
    spec = TrialSpec(number=3, engine="fake", settings={"record_dir": str(records)}, variants={},
                     params={"stubborn": True, "duration_s": 60.0},
                     workload={"prompts": "short", "max_tokens": 8, "warmup": 0, "repeats": 1},
                     quality={"enabled": False}, timeout_s=120, workdir=str(tmp_path / "w"))
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(json.loads(spec.to_json())))
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(spec_path)], start_new_session=True)
    child = None
    try:
        assert _wait(lambda: any(r.get("event") == "child" for r in read_records(records)), 60), \
            "the fake engine never started its child"
        child = next(r["child_pid"] for r in read_records(records) if r.get("event") == "child")
        (stub,) = children(runner.pid)
        (guard,) = children(stub)
        (worker,) = children(guard)
        pgid = os.getpgid(stub)
        assert pgid == stub and os.getpgid(guard) == os.getpgid(worker) == os.getpgid(child) == pgid
        pids = {"stub": stub, "runner": runner.pid, "worker": worker}
        for victim in victims:
            os.kill(pids[victim], signal.SIGKILL)
        assert _wait(lambda: not process_alive(child), 5), f"the SIGTERM-ignoring child {child} outlived it"
        assert _wait(lambda: group_members(pgid) == [], 2), group_members(pgid)
    finally:
        runner.kill()
        runner.wait()
        if child is not None and process_alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_worker_killed_by_a_signal_is_named_and_its_leftovers_killed(tmp_path):
    """The stub dies of the guard's signal, the guard of the worker's: the runner names it."""
    import threading

    from autotune.trial import run_trial

    records = tmp_path / "records"
    spec = TrialSpec(number=4, engine="fake", settings={"record_dir": str(records)}, variants={},
                     params={"stubborn": True, "duration_s": 60.0},
                     workload={"prompts": "short", "max_tokens": 8, "warmup": 0, "repeats": 1},
                     quality={"enabled": False}, timeout_s=120, workdir=str(tmp_path / "w"))
    out = []
    runner = threading.Thread(target=lambda: out.append(run_trial(spec)))
    runner.start()
    assert _wait(lambda: any(r.get("event") == "child" for r in read_records(records)), 60)
    rec = next(r for r in read_records(records) if r.get("event") == "child")
    os.kill(rec["pid"], signal.SIGSEGV)  # the worker "crashes"
    runner.join(30)
    assert not runner.is_alive()
    (result,) = out
    assert result.status == "failed"
    assert result.reason == "worker exited with code -11 (signal SIGSEGV) without a result"
    assert not process_alive(rec["child_pid"]) and group_members(rec["pgid"]) == []
