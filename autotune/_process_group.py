"""Stop a process group whole: SIGTERM, a grace period, then SIGKILL.

Shared by the trial runner (a trial's group), the engines that start build processes of their own
(:mod:`autotune.engines.cuda_ext`) and the CLI's own servers, so it sits at the bottom of the
package rather than inside any one of them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

KILL_GRACE_S = 5.0


def kill_group(pgid: int, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM a process group, then SIGKILL whatever is left after ``grace_s``."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop_process(proc: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> None:
    """Stop a child started with ``start_new_session=True``: SIGTERM its group, wait up to
    ``grace_s`` for the leader, then SIGKILL the group; the leader is always reaped."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()
