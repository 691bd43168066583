"""Process and port checks for the engine contract: what a trial left behind, from /proc.

Linux-only (the same /proc reads the ``openai_server`` engine uses to stop a server's
descendants); every helper returns empty results where /proc is missing.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from autotune._process_group import descendants

HOST = "127.0.0.1"
__all__ = ["children_of", "listening_ports", "port_open", "wait_gone"]


def children_of(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of every live descendant of ``pid``."""
    return descendants(pid)


def _alive(pid: int, started: str) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rpartition(")")[2].split()
    return fields[19] == started and fields[0] != "Z"


def wait_gone(procs: list[tuple[int, str]], timeout_s: float = 10.0) -> list[tuple[int, str]]:
    """Wait until none of ``procs`` (pid, start time) runs; return those still running."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in procs if _alive(*p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return out
    for fd in fds:
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def listening_ports(pids: list[int]) -> list[int]:
    """TCP ports in LISTEN state whose socket belongs to one of ``pids``."""
    inodes = set().union(*(_socket_inodes(p) for p in pids)) if pids else set()
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                ports.append(int(cols[1].rpartition(":")[2], 16))
    return sorted(set(ports))


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((HOST, port)) == 0
