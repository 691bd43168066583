"""Run ``autotune`` in this process, the way a shell would, for the fast test loop.

``run_cli_here(args, cwd)`` calls :func:`autotune.cli.main.main` with ``args`` from the
directory ``cwd`` and returns a :class:`subprocess.CompletedProcess` (exit code, stdout, stderr)
like the subprocess form does, so a test can switch between the two. What a call changes in
this process is put back: the working directory and the signal handlers ``main`` installs.
The console is 200 columns wide, as ``tests.conftest.run_cli`` sets it (``COLUMNS``).
One subprocess test per command is kept to prove the real entry point (tests/cli/).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
from pathlib import Path

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_cli_here(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``autotune ARGS`` in-process from ``cwd``; SystemExit (argparse) becomes the exit code."""
    from autotune.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    here = os.getcwd()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "200"
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.chdir(here)
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns
        for s, h in handlers.items():
            signal.signal(s, h)
    return subprocess.CompletedProcess(["autotune", *args], code, out.getvalue(), err.getvalue())
