"""autotune._files: atomic writes and log tails."""

from __future__ import annotations

import pytest

from autotune._files import TAIL_BYTES
from autotune._files import tail
from autotune._files import write_atomic


def test_write_atomic_replaces_whole_files(tmp_path):
    p = tmp_path / "x.json"
    write_atomic(p, "a" * 1000)
    write_atomic(p, "b")
    assert p.read_text() == "b" and len(list(tmp_path.iterdir())) == 1


def test_write_atomic_leaves_the_old_file_when_writing_fails(tmp_path):
    p = tmp_path / "sub" / "x.txt"
    write_atomic(p, "old")
    with pytest.raises(TypeError):
        write_atomic(p, b"not text")  # type: ignore[arg-type]
    assert p.read_text() == "old"
    assert [f.name for f in p.parent.iterdir()] == ["x.txt"]


@pytest.mark.parametrize(
    ("text", "lines", "sep", "expected"),
    [
        ("a\nb\nc\n", 2, "\n", "b\nc"),
        ("a\nb\nc\n\n\n", 2, "\n", "b\nc"),
        ("a\nb\nc", 40, " | ", "a | b | c"),
        ("", 40, "\n", ""),
    ],
)
def test_tail_keeps_the_last_lines(tmp_path, text, lines, sep, expected):
    p = tmp_path / "log.txt"
    p.write_text(text)
    assert tail(p, lines, sep) == expected


def test_tail_of_nothing_is_empty(tmp_path):
    assert tail(None) == ""
    assert tail(tmp_path / "missing.log") == ""


def test_tail_reads_only_the_end_of_a_huge_log(tmp_path):
    p = tmp_path / "big.log"
    p.write_bytes(b"\xff" * (TAIL_BYTES * 4) + b"\nlast line\n")
    assert tail(p, 1) == "last line"
    assert len(tail(p, 1000)) <= TAIL_BYTES
