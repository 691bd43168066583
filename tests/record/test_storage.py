"""The storage checks, WAL mode and online backup; what changes a resume refuses (pure)."""

from __future__ import annotations

import sqlite3

import pytest

from autotune.errors import ConfigError
from autotune.record.resume import changes
from autotune.record.storage import backup
from autotune.record.storage import check_db
from autotune.record.storage import db_problem
from autotune.record.storage import enable_wal


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "optuna.db"
    enable_wal(path)
    con = sqlite3.connect(path)
    con.execute("create table t (x text)")
    con.executemany("insert into t values (?)", [("x" * 500,)] * 200)
    con.commit()
    con.close()
    return path


def test_a_healthy_database_reads_fine_in_wal_mode(db):
    assert db_problem(db) == ""
    assert sqlite3.connect(db).execute("pragma journal_mode").fetchone() == ("wal",)


@pytest.mark.parametrize(("damage", "why"), [
    (lambda b: b"", "truncated: the file is empty"),
    (lambda b: b"garbage " * 4000, "file is not a database"),
    (lambda b: b[:len(b) // 2], "truncated:"),
    (lambda b: b[:60], "truncated:"),
])
def test_damage_is_named_in_one_line(db, damage, why):
    db.write_bytes(damage(db.read_bytes()))
    assert why in db_problem(db)
    with pytest.raises(ConfigError) as e:
        check_db(db.parent)
    assert "\n" not in str(e.value) and "autotune repair" in str(e.value) and why in str(e.value)


def test_missing_database_with_trials_on_disk_is_refused_for_run(tmp_path):
    check_db(tmp_path, for_run=True)  # a new study: nothing to say
    (tmp_path / "trials" / "0000").mkdir(parents=True)
    (tmp_path / "trials" / "0000" / "result.json").write_text("{}")
    with pytest.raises(ConfigError, match="missing but trials/ holds finished trials"):
        check_db(tmp_path, for_run=True)


def test_backup_is_a_whole_readable_copy(db):
    bak = backup(f"sqlite:///{db}")
    assert bak.name == "optuna.db.bak" and db_problem(bak) == ""
    assert sqlite3.connect(bak).execute("select count(*) from t").fetchone() == (200,)
    assert not bak.with_name("optuna.db.bak-wal").exists()


BASE = {"engine": "fake", "model variants": {}, "workload": {"repeats": 3, "max_tokens": 16},
        "quality reference": {"enabled": False}, "objectives": ["decode_tps"],
        "constraint metrics": ["ttft_p95_ms"], "budget": {"n_trials": 8}, "space": {"x": [0, 1]},
        "rules": [], "sampler": {"sampler": "auto"}, "select": {"rule": "max"},
        "constraint bounds": ["ttft_p95_ms <= 25"], "engine settings": {}}


@pytest.mark.parametrize(("part", "value", "refused"), [
    ("engine", "vllm", True),
    ("model variants", {"q4": {"path": "/m.gguf", "size": 1}}, True),
    ("workload", {"repeats": 5, "max_tokens": 16}, True),
    ("quality reference", {"enabled": True}, True),
    ("objectives", ["decode_tps", "ttft_p95_ms"], True),
    ("constraint metrics", ["ttft_p50_ms"], True),
    ("budget", {"n_trials": 20}, False),
    ("space", {"x": [0, 2]}, False),
    ("sampler", {"sampler": "tpe"}, False),
    ("select", {"rule": "knee"}, False),
    ("constraint bounds", ["ttft_p95_ms <= 30"], False),
])
def test_what_a_resume_refuses(part, value, refused):
    measured, steered = changes(BASE, {**BASE, part: value})
    assert bool(measured) is refused and bool(steered) is not refused
    assert (measured or steered)[0].startswith(part)


def test_refusal_names_the_changed_key():
    measured, _ = changes(BASE, {**BASE, "workload": {"repeats": 5, "max_tokens": 16}})
    assert measured == ["workload (workload.repeats 3 -> 5)"]
