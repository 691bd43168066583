"""Run one trial in an isolated subprocess, in its own process group, killed whole on timeout.

``run_trial(spec)`` never raises for a trial's own failure: a crash, a hang or a missing
result comes back as a :class:`TrialResult` with status ``failed`` or ``timeout``, the
reason and the tail of the trial's log. It is the function Ray runs on a worker.
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

from autotune._files import tail
from autotune._files import write_atomic
from autotune._process_group import KILL_GRACE_S
from autotune._process_group import kill_group
from autotune.trial.spec import TrialResult
from autotune.trial.spec import TrialSpec

GUARD = Path(__file__).with_name("guard.py")  # the trial group's first process


def run_trial(spec: TrialSpec, pass_fds: tuple[int, ...] | list[int] = ()) -> TrialResult:
    """Run ``spec`` in ``python -m autotune.trial.worker`` (under :mod:`autotune.trial.guard`,
    in a new process group) and return its result."""
    workdir = Path(spec.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / "spec.json"
    result_path = workdir / "result.json"
    log_path = workdir / "trial.log"
    result_path.unlink(missing_ok=True)
    write_atomic(spec_path, spec.to_json())
    # The guard sees EOF on `alive` when this process dies, however it dies (it never gets `tell`).
    alive, tell = os.pipe()
    # -I -S: the guard needs only the standard library (it starts in milliseconds)
    argv = [sys.executable, "-I", "-S", str(GUARD), str(alive), str(spec_path), str(result_path)]
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=os.environ.copy(), pass_fds=(alive, *pass_fds),
            )
        except BaseException:
            os.close(tell)
            raise
        finally:
            os.close(alive)
        try:
            rc = proc.wait(timeout=spec.timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            rc = None
        finally:
            kill_group(proc.pid, grace_s=KILL_GRACE_S if proc.poll() is None else 0.5)
            proc.wait()
            os.close(tell)
    duration = time.monotonic() - t0
    node = platform.node()
    if timed_out:
        return TrialResult(
            spec.number, "timeout", reason=f"timed out after {spec.timeout_s:g} s; process group killed",
            log_tail=tail(log_path), duration_s=duration, node=node,
        )
    if result_path.exists():
        try:
            result = TrialResult.from_json(result_path.read_text())
        except (ValueError, TypeError) as e:
            return TrialResult(
                spec.number, "failed", reason=f"unreadable result.json: {e}",
                log_tail=tail(log_path), duration_s=duration, node=node,
            )
        result = result.replace(duration_s=duration, node=node, log_tail=result.log_tail or tail(log_path))
        write_atomic(result_path, result.to_json())  # the worker could not know its own duration
        return result
    reason = f"worker exited with code {rc}" + (
        f" (signal {signal.Signals(-rc).name})" if rc is not None and rc < 0 else ""
    )
    return TrialResult(
        spec.number, "failed", reason=reason + " without a result", log_tail=tail(log_path),
        duration_s=duration, node=node,
    )
