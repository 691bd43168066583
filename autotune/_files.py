"""File helpers every layer uses: atomic writes and the tail of a log.

A leaf module: it imports only the standard library, so the trial runner, the engines, the
exporters and the tools can all depend on it without tying themselves to each other.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

TAIL_BYTES = 16384


def write_atomic(path: str | Path, text: str) -> None:
    """Write a file so readers never see it half-written (temp file + os.replace).

    Args:
        path: the file to write; its folder is created if missing.
        text: the whole content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def tail(path: str | Path | None, lines: int = 40, sep: str = "\n") -> str:
    """The last ``lines`` lines of a text log, joined with ``sep``.

    Reads at most the last ``TAIL_BYTES`` of the file, so a huge log costs nothing. Trailing
    blank lines do not count. Returns '' when ``path`` is None or the file cannot be read.
    """
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return sep.join(data.rstrip().splitlines()[-lines:])


def insert_comments(path: str | Path, lines: list[str]) -> None:
    """Put ``# line`` comments after the shebang of a text file (at the top if it has none).

    The file is rewritten atomically and keeps its mode (an exported script stays
    executable). Nothing is written when ``lines`` is empty.
    """
    if not lines:
        return
    path = Path(path)
    text = path.read_text().splitlines(keepends=True)
    at = 1 if text and text[0].startswith("#!") else 0
    mode = path.stat().st_mode
    write_atomic(path, "".join(text[:at] + [f"# {x}\n" for x in lines] + text[at:]))
    path.chmod(mode)
