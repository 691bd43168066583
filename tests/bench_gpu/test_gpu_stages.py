"""The staged GPU check on CPU: a stage killed mid-way keeps its finished rows, a re-run skips
what is done, stage selection, the budget, and the per-stage table.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from autotune.registry import get_engine_class
from bench.gpu.kit.check import Row
from bench.gpu.kit.check import exl3_cases
from bench.gpu.kit.check import main
from bench.gpu.kit.check import stage_cases
from bench.gpu.kit.stages import STAGES
from bench.gpu.kit.stages import Deadline
from bench.gpu.kit.stages import RowLog
from bench.gpu.kit.stages import run_rows
from bench.gpu.kit.stages import select_stages

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class StandIn:
    name: str
    engine: str = "stand-in"


STAGE = """
import sys, time
from dataclasses import dataclass
from pathlib import Path
from bench.gpu.kit.check import Row
from bench.gpu.kit.stages import Deadline, RowLog, run_rows

@dataclass(frozen=True)
class StandIn:
    name: str
    engine: str = "stand-in"

def run_one(case, timeout_s):
    time.sleep(0.3)  # a trial
    return Row(case.name, case.engine, "ok", decode_tps=1.0), {"timeout_s": timeout_s}

state, out = Path(sys.argv[1]), Path(sys.argv[2])
run_rows([StandIn(f"case {i}") for i in range(20)], run_one, RowLog(state, out), Deadline(600), 60)
"""


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_stage_killed_mid_way_keeps_its_finished_rows(tmp_path: Path) -> None:
    state, out = tmp_path / "state" / "rows.jsonl", tmp_path / "out" / "rows.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", STAGE, str(state), str(out)], cwd=ROOT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(_lines(out)) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # as the GPU machine does at its 10-minute limit
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    rows = [json.loads(line) for line in _lines(out)]
    assert 3 <= len(rows) < 20
    assert [r["row"]["case"] for r in rows] == [f"case {i}" for i in range(len(rows))]
    assert all(r["row"]["status"] == "ok" for r in rows)
    assert len(_lines(state)) >= len(rows)

    done_before = len(_lines(state))
    with open(state, "a") as f:
        f.write('{"row": {"case": "case 19", "sta')  # a row cut off by the kill
    ran: list[str] = []

    def run_one(case, timeout_s):
        ran.append(case.name)
        return Row(case.name, case.engine, "ok"), {}

    log = RowLog(state, out)
    result = run_rows([StandIn(f"case {i}") for i in range(20)], run_one, log, Deadline(600), 60,
                      say=lambda m: None)
    assert ran == [f"case {i}" for i in range(done_before, 20)]  # the rest, nothing twice
    assert result.already_done == [f"case {i}" for i in range(done_before)]
    assert len(log.latest()) == 20 and len(log.read()) == 20


def test_skipped_rows_are_run_again_and_the_latest_row_counts(tmp_path: Path) -> None:
    log = RowLog(tmp_path / "rows.jsonl")
    cases = [StandIn("a"), StandIn("b")]
    run_rows(cases, lambda c, t: (Row(c.name, c.engine, "skipped", reason="no model yet"), {}), log,
             Deadline(60), 10, say=lambda m: None)
    assert log.done() == set()
    result = run_rows(cases, lambda c, t: (Row(c.name, c.engine, "ok"), {}), log, Deadline(60), 10,
                      say=lambda m: None)
    assert result.ran == ["a", "b"]
    assert {c: r["row"]["status"] for c, r in log.latest().items()} == {"a": "ok", "b": "ok"}


def test_the_budget_stops_new_rows_and_caps_timeouts(tmp_path: Path) -> None:
    now = [0.0]
    deadline = Deadline(100, clock=lambda: now[0])
    assert deadline.timeout(240) == 100
    now[0] = 95
    assert deadline.timeout(240) == 30  # the floor
    now[0] = 101
    said: list[str] = []
    result = run_rows([StandIn("a")], lambda c, t: (Row(c.name, c.engine, "ok"), {}),
                      RowLog(tmp_path / "r.jsonl"), deadline, 240, say=said.append)
    assert result.ran == [] and result.out_of_time == ["a"] and "run this stage again" in said[-1]


def test_stage_selection() -> None:
    assert select_stages(["all"]) == list(STAGES)
    assert select_stages(["table", "env", "exl2-b"]) == ["env", "exl2-b", "table"]
    assert select_stages([]) == list(STAGES)
    with pytest.raises(ValueError, match="unknown stage 'exl4'"):
        select_stages(["exl4"])


def test_the_row_groups_split_the_cases() -> None:
    a, b = stage_cases("exl2-a", [4.0, 6.0], 80.0), stage_cases("exl2-b", [4.0, 6.0], 80.0)
    assert a and b and not {c.name for c in a} & {c.name for c in b}
    assert {c.engine for c in stage_cases("llamacpp", [4.0, 6.0], 80.0)} == {"llama_server"}
    assert {c.engine for c in stage_cases("exl3", [4.0, 6.0], 80.0)} == {"exllamav3"}


@pytest.mark.parametrize("case", exl3_cases(), ids=lambda c: c.name)
def test_every_exl3_case_passes_its_engine_check(case) -> None:
    assert get_engine_class(case.engine).check(case.params, case.settings) == []


def test_one_stage_alone_writes_its_rows_and_the_table(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is here: run the real check")
    out, work = tmp_path / "out", tmp_path / "work"
    assert main(["--stage", "exl2-a", "--out", str(out), "--work", str(work)]) == 0
    names = {c.name for c in stage_cases("exl2-a", [4.0, 6.0], 80.0)}
    rows = [json.loads(line)["row"] for line in _lines(out / "rows.jsonl")]
    assert {r["case"] for r in rows} == names and {r["status"] for r in rows} == {"skipped"}
    assert "| exl2 4bpw base | exllamav2 | skipped |" in (out / "gpu_check.md").read_text()
    assert (work / "env.json").exists() and (work / "rows.jsonl").exists()
    assert main(["--stage", "table", "--out", str(tmp_path / "out2"), "--work", str(work)]) == 0
    data = json.loads((tmp_path / "out2" / "gpu_check.json").read_text())
    assert {r["case"] for r in data["rows"]} == names  # the table of every stage so far


def test_the_models_stage_makes_only_what_is_missing(tmp_path: Path) -> None:
    from bench.gpu.kit.prepare import stage_models
    from bench.gpu.kit.stages import mark_done

    for name in ("hf-target", "hf-draft"):  # made by an earlier command on the machine
        (tmp_path / name).mkdir()
        mark_done(tmp_path / name)
    for name, bpw in (("exl2-t4", 4.0), ("exl2-d", 4.0)):
        (tmp_path / name).mkdir()
        mark_done(tmp_path / name, {"path": str(tmp_path / name), "bpw": bpw})
    now = [0.0]
    spent = Deadline(0, clock=lambda: now[0])  # no time left: start no conversion
    variants = stage_models(tmp_path, [4.0, 6.0], {"exllamav2": True}, spent)
    assert variants["t4"] == {"path": str(tmp_path / "exl2-t4"), "bpw": 4.0} and "d" in variants
    assert "t6" not in variants  # still to make: the next run of the stage does it
    assert json.loads((tmp_path / "variants.json").read_text())["t4"]["bpw"] == 4.0


def test_engines_left_out_of_a_command_say_so() -> None:
    from bench.gpu.kit.check import engine_skips

    env = {"cuda": True, "transformers": True, "exllamav2": True, "exllamav3": True, "llama_server": True}
    assert engine_skips(env) == {}
    assert engine_skips({**env, "llama_server": False})["llama_server"].startswith("no CUDA llama-server")
    assert engine_skips(env, ["exllamav2"]) == {"llama_server": "left out of this command (--engines)",
                                                "exllamav3": "left out of this command (--engines)"}
    no_v3 = engine_skips({**env, "exllamav3": False}, ["exllamav2"])  # the real reason comes first
    assert no_v3["exllamav3"].startswith("exllamav3 is not installed")


def test_the_total_budget_spans_the_stages_of_a_command(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    assert main(["--stage", "env", "exl2-a", "--total-s", "0", "--out", str(out), "--work", str(work)]) == 0
    assert (work / "env.json").exists() and _lines(out / "rows.jsonl") == []  # no row started past it
    assert main(["--stage", "exl2-a", "--total-s", "600", "--out", str(out), "--work", str(work)]) == 0
    assert len(_lines(out / "rows.jsonl")) == len(stage_cases("exl2-a", [4.0, 6.0], 80.0))
