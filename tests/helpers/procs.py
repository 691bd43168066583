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
