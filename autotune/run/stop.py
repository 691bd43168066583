"""SIGTERM and SIGHUP stop a study the way Ctrl-C does.

``docker stop``, systemd, batch schedulers and ``kill`` send SIGTERM; a closed terminal
sends SIGHUP. :func:`install` makes both raise :class:`Stopped`, a ``KeyboardInterrupt``,
in the main thread, so they take Ctrl-C's one path: the driver stops the trials in flight,
marks them interrupted, writes the exports and the summary, and ``autotune run`` exits
with ``128 + signal`` (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP; :func:`exit_code`).

``ray.init`` installs its own SIGTERM handler (``sys.exit``) and Ray's core worker a native
one that dumps a stack and aborts (exit 134), so the driver calls :func:`install` again
once Ray is up. While the stop is under way, further SIGTERMs and SIGHUPs are noted and
ignored, so the exports get written; SIGKILL still ends it at once.
"""

from __future__ import annotations

import signal
import sys

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM or SIGHUP; ``signum`` is the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# Ray's blocking calls (ray.wait, ray.get) run the handler from C++ and re-raise a plain
# KeyboardInterrupt, so the signal is also kept here: the process has one set of handlers.
_received: list[int] = []


def received() -> int | None:
    """The SIGTERM / SIGHUP that started the stop (None: none, or Ctrl-C)."""
    return _received[0] if _received else None


def exit_code(exc: BaseException | None = None) -> int:
    """The shell's code for the stop: 128 + the signal (SIGINT when no other was received)."""
    return 128 + int(getattr(exc, "signum", None) or received() or signal.SIGINT)


def name(exc: BaseException | None = None) -> str:
    """The stopping signal's name (``SIGINT`` for Ctrl-C)."""
    return signal.Signals(exit_code(exc) - 128).name


def _again(signum: int, frame: object) -> None:  # noqa: ARG001
    try:  # after SIGHUP the terminal may be gone: the stop must go on regardless
        print(f"autotune: {signal.Signals(signum).name} received; already stopping (writing the "
              "exports); SIGKILL ends it at once", file=sys.stderr, flush=True)
    except OSError:
        pass


def _stop(signum: int, frame: object) -> None:  # noqa: ARG001
    for s in SIGNALS:
        signal.signal(s, _again)
    _received.append(signum)
    raise Stopped(signum)


def install() -> None:
    """SIGTERM and SIGHUP raise :class:`Stopped` (main thread only; a no-op elsewhere)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for s in SIGNALS:
        signal.signal(s, _again if _received else _stop)
