"""One owner per study: an advisory lock file in the study directory, held by ``autotune run``.

``<study.dir>/.lock`` is locked with ``fcntl.flock`` for the life of the run and holds the
owner as JSON (pid, host, start time). The kernel drops the lock when its holder exits,
however it exits, so a lock left by a dead driver is free: the next run takes it over and
says so in one line. A second ``autotune run`` of a locked study is refused with one line
naming the holder and how to proceed (:class:`StudyLocked`, exit 2). ``ls``, ``report``,
``export`` and ``ui`` never take the lock: they read a running study as it is.

On a shared file system (NFS v4, CephFS, Lustre mounted with ``flock``) the lock also holds
between drivers on different machines. Where ``flock`` is not supported (``ENOLCK``), the
JSON content decides: a holder on this host is checked by pid, one on another host is
trusted until its lock file is removed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import ConfigError

LOCK_FILE = ".lock"


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a study's lock."""

    pid: int
    host: str
    since: float  # time.time() when the run took the lock

    @classmethod
    def me(cls) -> Holder:
        return cls(os.getpid(), socket.gethostname(), time.time())

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        try:
            data = json.loads(text)
            return cls(int(data["pid"]), str(data["host"]), float(data["since"]))
        except (ValueError, KeyError, TypeError):
            return None

    def to_json(self) -> str:
        return json.dumps({"pid": self.pid, "host": self.host, "since": self.since,
                           "since_utc": self.since_text()}) + "\n"

    def since_text(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))

    def alive(self) -> bool | None:
        """Whether the process runs (None: on another host, cannot tell)."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


class StudyLocked(ConfigError):
    """Another driver runs this study (exit 2, one line)."""

    def __init__(self, study_dir: Path, holder: Holder | None) -> None:
        who = (f"pid {holder.pid} on {holder.host} since {holder.since_text()}" if holder
               else "another process")
        kill = f"stop it (kill {holder.pid}" + (f" on {holder.host}" if holder and holder.host
                                                != socket.gethostname() else "") + ")" \
            if holder else "stop it"
        super().__init__("study.dir", str(study_dir),
                         f"this study is being run by {who}; wait for it to end, {kill}, or run "
                         "another study with study.name=NEW_NAME (ls/report/export/ui work "
                         "meanwhile)")
        self.holder = holder


class StudyLock:
    """The advisory lock of one study directory.

    Lifecycle: :meth:`acquire` (raises :class:`StudyLocked`) -> the run -> :meth:`release`
    (also implied by the process exiting). Not thread-safe; one per driver process.
    """

    def __init__(self, study_dir: str | Path) -> None:
        self.dir = Path(study_dir)
        self.path = self.dir / LOCK_FILE
        self.fd: int | None = None
        self.note = ""  # one line when a stale lock was taken over

    def acquire(self) -> StudyLock:
        """Take the lock or raise :class:`StudyLocked` naming the holder; returns self."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        previous = Holder.parse(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StudyLocked(self.dir, previous) from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(fd)
                raise
            if previous is not None and previous.alive() is not False:  # no flock here
                os.close(fd)
                raise StudyLocked(self.dir, previous) from None
        if previous is not None and previous.pid != os.getpid():
            state = {False: "dead", None: "on another host, lock free"}.get(previous.alive(), "lock free")
            self.note = (f"took over the lock of a stopped run (pid {previous.pid} on {previous.host}, "
                         f"since {previous.since_text()}: {state})")
        os.ftruncate(fd, 0)
        os.pwrite(fd, Holder.me().to_json().encode(), 0)
        os.fsync(fd)
        self.fd = fd
        return self

    def release(self) -> None:
        """Clear the owner and drop the lock (idempotent)."""
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)
        finally:
            os.close(self.fd)  # closing the last descriptor releases the flock
            self.fd = None

    def __enter__(self) -> StudyLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder_of(study_dir: Path) -> Holder | None:
    """The live holder of a study's lock (None if nobody runs it). Takes no lock."""
    path = Path(study_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        holder = Holder.parse(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return holder
        except OSError:
            return holder if holder and holder.alive() is not False else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
