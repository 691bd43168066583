"""Process checks for tests, read from /proc: is a pid alive, who mentions a path or port."""

from __future__ import annotations

from pathlib import Path


def process_alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def processes_with_arg(*needles: str) -> list[int]:
    """Live PIDs whose command line contains ``needles`` as consecutive argv items, or (one
    needle) as a substring of one argv item."""
    out = []
    seq = "\0".join(needles)
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (entry / "cmdline").read_bytes().decode("utf-8", "replace")
        except OSError:
            continue
        if seq in cmdline and process_alive(int(entry.name)):
            out.append(int(entry.name))
    return out


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name: state, ppid, pgrp, ... (None: gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def parent(pid: int) -> int | None:
    """``pid``'s parent (None if it is gone)."""
    st = _stat(pid)
    return int(st[1]) if st else None


def children(pid: int) -> list[int]:
    """The live direct children of ``pid``."""
    return [int(e.name) for e in Path("/proc").glob("[0-9]*")
            if (st := _stat(int(e.name))) and st[0] != "Z" and int(st[1]) == pid]


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    return [int(e.name) for e in Path("/proc").glob("[0-9]*")
            if (st := _stat(int(e.name))) and st[0] != "Z" and int(st[2]) == pgid]
