"""Ctrl-C, SIGTERM and SIGHUP stop a study one way.

``docker stop``, systemd, batch schedulers and ``kill`` send SIGTERM; a closed terminal
sends SIGHUP. :func:`install` makes all three raise :class:`Stopped`, a ``KeyboardInterrupt``,
in the main thread, so they take one path: the driver stops the trials in flight,
marks them interrupted, writes the exports and the summary, and ``autotune run`` exits
with ``128 + signal`` (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP; :func:`exit_code`).

``ray.init`` installs its own SIGTERM handler (``sys.exit(15)``), so the driver calls
:func:`install` again once Ray is up, and :func:`ray_start` turns a SIGTERM that came during
``ray.init`` into the same stop (exit 143, not 15). Ray's core worker would also install a native
one that dumps a stack and may abort the driver (exit -6): :mod:`autotune.run.placement` turns it
off with Ray's switch before importing Ray. While the stop is under way, further signals are noted and
ignored, so the exports get written; SIGKILL still ends it at once.

The signal is also kept (:func:`received`): a library that catches ``KeyboardInterrupt``
on its way (a clean-clone CI run once lost a Ctrl-C that way) cannot swallow the stop, since
the driver calls :func:`check` on every turn of its loop.

Inside :func:`deferred` the signal is only noted: there the main thread asks, tells and logs
through SQLite, and an exception raised mid-query once left Optuna's session holding a lock,
so that marking the trials in flight interrupted failed with "database is locked" (exit 1,
not 143). The driver runs its loop deferred and lets the stop raise at once only while it
waits for trials (:func:`interruptible`), which is where a study spends its time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """Raised in the main thread by Ctrl-C, SIGTERM or SIGHUP; ``signum`` is the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# Ray's blocking calls (ray.wait, ray.get) run the handler from C++ and re-raise a plain
# KeyboardInterrupt, so the signal is also kept here: the process has one set of handlers.
_received: list[int] = []
_deferring: list[bool] = [False]  # inside deferred(): note the signal, raise it at a check


def received() -> int | None:
    """The signal that started the stop (None: none yet)."""
    return _received[0] if _received else None


def exit_code(exc: BaseException | None = None) -> int:
    """The shell's code for the stop: 128 + the signal (SIGINT when no other was received)."""
    return 128 + int(getattr(exc, "signum", None) or received() or signal.SIGINT)


def name(exc: BaseException | None = None) -> str:
    """The stopping signal's name (``SIGINT`` for Ctrl-C)."""
    return signal.Signals(exit_code(exc) - 128).name


def _again(signum: int, frame: object) -> None:  # noqa: ARG001
    _received.append(signum)
    try:  # after SIGHUP the terminal may be gone: the stop must go on regardless
        print(f"autotune: {signal.Signals(signum).name} received; already stopping (writing the "
              "exports); SIGKILL ends it at once", file=sys.stderr, flush=True)
    except OSError:
        pass


def _stop(signum: int, frame: object) -> None:  # noqa: ARG001
    for s in SIGNALS:
        signal.signal(s, _again)
    _received.append(signum)
    if not _deferring[0]:
        raise Stopped(signum)


def mark() -> int:
    """How many stop signals came so far (:func:`check` looks only at those after it)."""
    return len(_received)


def check(since: int = 0) -> None:
    """Raise :class:`Stopped` if a stop signal came after ``since`` (a :func:`mark`) but its
    exception was swallowed on its way, or it came while a signal was already noted."""
    if len(_received) > since:
        raise Stopped(_received[since])


def install(fresh: bool = False) -> None:
    """Ctrl-C, SIGTERM and SIGHUP raise :class:`Stopped` (main thread only; a no-op elsewhere).

    ``fresh`` forgets a signal received before (each ``autotune`` command starts fresh, even
    when several run in one process, as in the tests).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if fresh:
        _received.clear()
    for s in SIGNALS:
        signal.signal(s, _again if _received else _stop)


@contextlib.contextmanager
def _deferring_as(value: bool) -> Iterator[None]:
    before, _deferring[0] = _deferring[0], value
    try:
        yield
    finally:
        _deferring[0] = before


def deferred() -> contextlib.AbstractContextManager[None]:
    """A stop signal that comes inside is noted, not raised: :func:`check` (or entering
    :func:`interruptible`) raises it where no database write is cut in two."""
    return _deferring_as(True)


def interruptible(since: int = 0) -> contextlib.AbstractContextManager[None]:
    """Inside :func:`deferred`, a wait that a stop may cut at once: a stop noted since
    ``since`` (a :func:`mark`) is raised on the way in, one that comes inside at once."""
    check(since)
    return _deferring_as(False)


@contextlib.contextmanager
def ray_start() -> Iterator[None]:
    """Around ``ray.init``: its own SIGTERM handler (``sys.exit(signum)``) pre-empts ours from
    its first line, so a SIGTERM during Ray's start-up ends up here as ``SystemExit(15)``; it
    becomes :class:`Stopped` (after ``ray.shutdown``, which stops what Ray had started).

    That ``SystemExit`` can also be lost: raised while a finalizer or a callback runs, Python
    prints it and goes on (a clean-clone CI run once finished the whole study with exit 0
    after a SIGTERM during ``ray.init``). So the signals that arrive inside are also read from
    the process's wakeup fd, at the C level, whichever Python handler ran; a stop signal no
    handler of ours noted is noted on the way out, and the caller's :func:`check` raises it.
    Our handlers are installed again either way."""
    since, wake = len(_received), _Wakeup()
    try:
        yield
    except SystemExit as e:
        if e.code != signal.SIGTERM:
            raise
        import ray

        ray.shutdown()
        _received.append(signal.SIGTERM)
        raise Stopped(signal.SIGTERM) from None
    finally:
        came = [s for s in wake.close() if s in SIGNALS]
        _received.extend(came[len(_received) - since:])  # those whose exception was lost
        install()


class _Wakeup:
    """The signal numbers the C-level handler writes to a pipe (``signal.set_wakeup_fd``)
    from now until :meth:`close`; nothing in another thread than the main one."""

    def __init__(self) -> None:
        self.fds: tuple[int, int] | None = None
        if threading.current_thread() is threading.main_thread():
            self.fds = os.pipe()
            for fd in self.fds:
                os.set_blocking(fd, False)
            self.before = signal.set_wakeup_fd(self.fds[1], warn_on_full_buffer=False)

    def close(self) -> list[int]:
        if self.fds is None:
            return []
        r, w = self.fds
        current = signal.set_wakeup_fd(self.before)
        if current != w:  # someone else's since: leave theirs
            signal.set_wakeup_fd(current)
        data = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(r, 4096):
                data += chunk
        os.close(r)
        os.close(w)
        return list(data)
