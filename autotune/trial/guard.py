"""The trial's first process: ``python guard.py SPEC.json RESULT.json`` (stdlib only).

The runner starts this in a new session (the trial's process group); it starts the worker
(``python -m autotune.trial.worker``) in the same group and exits as the worker did.

Why a process in between: when a Ray worker exits (its driver was killed, the study
stopped), Ray SIGKILLs that worker's direct children (``kill_child_processes_on_worker_exit``,
on by default). Were the direct child the trial worker, it would die before its watchdog
could act, and what it started (an engine's server, a child ignoring SIGTERM) would be left
running. Now the direct child is this guard: the worker's watchdog sees its parent go and
kills the whole group. If the runner dies while the guard lives (a SIGKILLed Ray worker), the
guard sees it and kills the group itself. When the worker ends first (a timeout's SIGTERM, a
crash), the guard stays until the rest of the group is gone, and kills it after a grace.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5
GRACE_S = 5.0  # as the runner's KILL_GRACE_S


def _others() -> list[int]:
    """The live processes of this process group other than this one (read from /proc)."""
    me, group, out = os.getpid(), os.getpgrp(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            out.append(int(name))
    return out


def main(argv: list[str]) -> int:
    parent = os.getppid()
    worker = subprocess.Popen([sys.executable, "-m", "autotune.trial.worker", *argv])
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # the worker decides; the runner's
        signal.signal(s, signal.SIG_IGN)  # group SIGKILL after its grace still ends this process
    while True:
        try:
            rc = worker.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:  # the runner is gone: nobody else will stop the trial
                os.killpg(os.getpgrp(), signal.SIGKILL)
    # The worker is gone but what it started may linger (a server still shutting down, a child
    # ignoring SIGTERM): give it the runner's grace, then kill it; at once if the runner went.
    deadline = time.monotonic() + GRACE_S
    while _others() and os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in _others():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if rc < 0:  # killed by a signal: die of the same one, so the runner can name it
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
