"""A study's SQLite storage: checked before use, written in WAL mode, backed up online.

- :func:`check_db` tells in one line why ``optuna.db`` cannot be read (not a database,
  truncated, malformed) as a :class:`~autotune.errors.ConfigError` (exit 2) that points at
  ``autotune repair``; every command calls it before SQLAlchemy ever sees the file.
- :func:`open_rdb` opens Optuna's ``RDBStorage`` with the database in WAL mode: a driver
  killed mid-write leaves the last committed transaction intact and readers (``ls``,
  ``report``) never block the writer.
- :func:`backup` copies the live database with ``sqlite3.Connection.backup`` into
  ``optuna.db.bak`` (through a temporary file and ``os.replace``, so the backup is always
  whole). The driver calls it after each told trial: a file lost or mangled later costs at
  most the trials told since, and ``autotune repair`` rebuilds those from ``trials/``.

Storages other than SQLite files (PostgreSQL, MySQL) are left to their server.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from autotune.errors import ConfigError

DB_FILE = "optuna.db"
BACKUP_SUFFIX = ".bak"
HEADER = b"SQLite format 3\x00"


def sqlite_path(url: str) -> Path | None:
    """The file behind a ``sqlite:///`` storage URL (None for any other storage)."""
    if not url.startswith("sqlite:///"):
        return None
    return Path(url[len("sqlite:///"):])


def db_problem(path: Path) -> str:
    """Why the SQLite file at ``path`` cannot be read ('' when it reads fine)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as e:
        return e.strerror or str(e)
    if size == 0:
        return "truncated: the file is empty (0 bytes)"
    if not head.startswith(HEADER[:15]) or len(head) < 100:
        return "file is not a database (no SQLite header)" if not head.startswith(HEADER[:6]) \
            else f"truncated: {size} bytes, shorter than an SQLite header"
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    valid = head[24:28] == head[92:96]  # the header's page count is current
    pages = int.from_bytes(head[28:32], "big") if valid else 0
    wal = path.with_name(path.name + "-wal")
    if pages and size < page * pages and not (wal.exists() and wal.stat().st_size):
        return f"truncated: {size} bytes of the {page * pages} its header declares"
    try:
        # read-write: after a driver was killed, opening a WAL database recovers its index
        # (a read-only connection cannot, and would call a healthy file unreadable)
        con = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=rw", uri=True, timeout=30)
        try:
            rows = con.execute("PRAGMA quick_check").fetchall()
        finally:
            con.close()
    except sqlite3.Error as e:
        return str(e)
    if rows != [("ok",)]:
        return "malformed: " + "; ".join(str(r[0]) for r in rows[:3])
    return ""


def check_db(study_dir: Path, url: str | None = None, for_run: bool = False) -> None:
    """Raise a one-line :class:`ConfigError` if the study's SQLite storage cannot be read.

    A missing ``optuna.db`` is an error for the commands that read a study; for ``run``
    (``for_run``) only when ``trials/`` holds finished trials (it would start over).
    """
    path = sqlite_path(url) if url else Path(study_dir) / DB_FILE
    if path is None:
        return
    repair = f"`autotune repair {study_dir}` rebuilds it from {Path(study_dir) / 'trials'}"
    if not path.exists():
        done = any((Path(study_dir) / "trials").glob("[0-9][0-9][0-9][0-9]/result.json"))
        if done:
            raise ConfigError(DB_FILE, str(path), "is missing but trials/ holds finished trials; " + repair)
        if not for_run:
            raise ConfigError(DB_FILE, str(path), "is missing: the study has no trials yet")
        return
    why = db_problem(path)
    if why:
        raise ConfigError(DB_FILE, str(path), f"is unreadable ({why}); {repair}")


def enable_wal(path: Path) -> None:
    """Switch the database at ``path`` (created if missing) to WAL; the mode persists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, timeout=30)
    try:
        con.execute("PRAGMA journal_mode=WAL")
    finally:
        con.close()


def open_rdb(url: str):
    """Optuna's ``RDBStorage`` for ``url``; SQLite files in WAL mode with a 30 s busy wait."""
    import optuna

    path = sqlite_path(url)
    if path is None:
        return url
    enable_wal(path)
    return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 30}})


def backup(url: str) -> Path | None:
    """Copy the live SQLite database to ``<db>.bak`` atomically; its path (None if not SQLite)."""
    path = sqlite_path(url)
    if path is None or not path.exists():
        return None
    target = path.with_name(path.name + BACKUP_SUFFIX)
    tmp = target.with_name(target.name + ".tmp")
    tmp.unlink(missing_ok=True)
    src = sqlite3.connect(path, timeout=30)
    try:
        dst = sqlite3.connect(tmp)
        try:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
        finally:
            dst.close()
    finally:
        src.close()
    os.replace(tmp, target)
    return target
