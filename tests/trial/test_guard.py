"""A trial whose worker is SIGKILLed from outside leaves nothing behind.

When a Ray worker exits (its driver was killed), Ray SIGKILLs that worker's direct children.
The runner's direct child is the guard (autotune.trial.guard), so the trial worker below it
sees its parent go and kills the whole group: here a fake engine's child that ignores SIGTERM,
standing in for an engine's server. Real processes, no Ray needed: the test does what Ray does.
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


@pytest.mark.parametrize("victim", ["guard", "runner"])
def test_killing_the_runner_or_its_child_stops_the_whole_trial(tmp_path, victim):
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
        (guard,) = children(runner.pid)
        pgid = os.getpgid(guard)
        # Ray's KillChildProcs SIGKILLs the direct child; a SIGKILLed Ray worker is the runner
        os.kill(guard if victim == "guard" else runner.pid, signal.SIGKILL)
        assert _wait(lambda: not process_alive(child), 5), f"the SIGTERM-ignoring child {child} outlived it"
        assert group_members(pgid) == []
    finally:
        runner.kill()
        runner.wait()
        if child is not None and process_alive(child):
            os.kill(child, signal.SIGKILL)

