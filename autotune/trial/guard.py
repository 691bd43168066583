"""The trial's first processes: ``python guard.py FD SPEC.json RESULT.json`` (stdlib only).

The runner starts this in a new session (the trial's process group) with the read end of a
pipe as ``FD``; the runner holds the write end, so the read end sees EOF the moment the runner
dies, however it dies. This process forks at once:

* the **stub** (the group leader, the runner's direct child) only waits for the guard below and
  exits as it did, dying of the same signal so the runner can name it;
* the **guard** starts the worker (``python -m autotune.trial.worker``) in the same group.

Why two processes: when a Ray worker exits (its driver was killed, the study stopped), Ray
SIGKILLs that worker's direct children (``kill_child_processes_on_worker_exit``, on by default).
That is the stub, never the guard, so whatever the trial has started (an engine's server, a
child ignoring SIGTERM) always has a watcher: the guard kills the whole group when the runner
is gone, and when the worker ends first (a timeout's SIGTERM, a crash) it stays until the rest
of the group is gone, killing it after the runner's grace, at once if the runner went.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

POLL_S = 0.5
GRACE_S = 5.0  # as the runner's KILL_GRACE_S
GUARD_ENV = "AUTOTUNE_TRIAL_GUARD"  # tells the worker its guard's pid (autotune.trial.worker)
STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _others() -> list[int]:
    """The live processes of this process group other than this one and the group leader."""
    me, group, out = os.getpid(), os.getpgrp(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (me, group):
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            out.append(int(name))
    return out


def _runner_gone(fd: int, wait_s: float = 0.0) -> bool:
    """True once the runner's end of the pipe is closed (it never writes: readable means EOF)."""
    return bool(select.select([fd], [], [], wait_s)[0])


def _exit_as(code: int) -> int:
    if code < 0:  # killed by a signal: die of the same one
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _stub(guard: int) -> int:
    for s in STOPS:  # the worker decides; the runner's group SIGKILL still ends this process
        signal.signal(s, signal.SIG_IGN)
    return _exit_as(os.waitstatus_to_exitcode(os.waitpid(guard, 0)[1]))


def _guard(fd: int, argv: list[str]) -> int:
    # close_fds=False: the descriptors the runner passed (GPU leases) live as long as the worker
    worker = subprocess.Popen([sys.executable, "-m", "autotune.trial.worker", *argv],
                              close_fds=False, env={**os.environ, GUARD_ENV: str(os.getpid())})
    for s in STOPS:
        signal.signal(s, signal.SIG_IGN)
    while worker.poll() is None:
        if _runner_gone(fd, POLL_S):  # nobody else will stop the trial
            os.killpg(os.getpgrp(), signal.SIGKILL)
    # The worker is gone but what it started may linger (a server still shutting down, a child
    # ignoring SIGTERM): give it the runner's grace, then kill it; at once if the runner went.
    deadline = time.monotonic() + GRACE_S
    while _others() and time.monotonic() < deadline and not _runner_gone(fd, 0.05):
        pass
    for pid in _others():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return _exit_as(worker.returncode)


def main(argv: list[str]) -> int:
    fd, rest = int(argv[0]), argv[1:]
    pid = os.fork()
    return _stub(pid) if pid else _guard(fd, rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
