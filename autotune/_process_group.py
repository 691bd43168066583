"""Stop a process group whole: SIGTERM, a grace period, then SIGKILL.

Shared by the trial runner (a trial's group), the engines that start build processes of their own
(:mod:`autotune.engines.cuda_ext`), the servers the engines and the CLI start, and the report's
PNG export (kaleido's Chromium), so it sits at the bottom of the package rather than inside any
one of them. A child that starts its own session (Chromium does) leaves its parent's group:
:func:`stop_tree` finds such descendants from /proc before stopping the parent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

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


def stop_tree(proc: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM ``proc``, SIGKILL after ``grace_s``; then kill the descendants it left behind.

    Descendants (vLLM's engine-core and workers, kaleido's Chromium in a session of its own) are
    listed before ``proc`` is stopped and killed only if the same process (pid and start time)
    still runs.
    """
    children = descendants(proc.pid)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pid, started in children:
        if start_time(pid) == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None."""
    fields = _stat_fields(pid)
    return fields[19] if fields else None


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of every descendant of ``pid``, read from /proc ([] without it)."""
    parents: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat_fields(int(entry.name))
        if fields:
            parents.setdefault(int(fields[1]), []).append((int(entry.name), fields[19]))
    out: list[tuple[int, str]] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child[0])
    return out
