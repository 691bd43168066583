"""The study lock: one owner, stale locks taken over, the holder named, readers never blocked."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from autotune.record.lock import LOCK_FILE
from autotune.record.lock import StudyLock
from autotune.record.lock import StudyLocked
from autotune.record.lock import holder_of

HOLD = ("import sys, time\nfrom autotune.record.lock import StudyLock\n"
        "lock = StudyLock(sys.argv[1]).acquire()\nprint('held', flush=True)\ntime.sleep(60)\n")


@pytest.fixture
def other_holder(tmp_path):
    """A real second process holding the lock of ``tmp_path``."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def test_second_owner_is_refused_with_the_holder(tmp_path, other_holder):
    with pytest.raises(StudyLocked) as e:
        StudyLock(tmp_path).acquire()
    line = str(e.value)
    assert "\n" not in line
    assert f"pid {other_holder.pid} on {socket.gethostname()}" in line
    assert f"kill {other_holder.pid}" in line and "study.name=" in line
    assert holder_of(tmp_path).pid == other_holder.pid  # readers see who holds it, take nothing


def test_lock_of_a_dead_process_is_taken_over_with_a_note(tmp_path, other_holder):
    other_holder.kill()
    other_holder.wait()
    assert holder_of(tmp_path) is None
    lock = StudyLock(tmp_path).acquire()
    try:
        assert f"pid {other_holder.pid}" in lock.note and "dead" in lock.note
        data = json.loads((tmp_path / LOCK_FILE).read_text())
        assert data["pid"] == os.getpid() and data["host"] == socket.gethostname()
    finally:
        lock.release()


def test_release_frees_the_lock_and_leaves_no_note(tmp_path):
    with StudyLock(tmp_path) as lock:
        assert holder_of(tmp_path).pid == os.getpid()
        assert lock.note == ""
    assert holder_of(tmp_path) is None
    again = StudyLock(tmp_path).acquire()
    assert again.note == ""
    again.release()
    again.release()  # idempotent
