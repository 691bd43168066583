"""Bad input to ``autotune report|export|ui|ls``: one line on stderr, exit code 2, nothing
written; ``--help`` for each; and the pure helpers of the MLflow view. The commands run
in-process (tests/helpers/cli.py); tests/cli/test_commands.py runs them as real subprocesses."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.record.mlflow_view import run_name
from autotune.record.mlflow_view import units_note
from autotune.record.mlflow_view import varying_params
from tests.helpers.cli import run_cli_here


@pytest.mark.parametrize(("args", "needle"), [
    (["report", "no-such-study"], "STUDY_DIR: got 'no-such-study'"),
    (["report"], "no study found"),
    (["export", "--trial", "x"], "invalid int value: 'x'"),
    (["export", "no-such-study", "--trial", "3"], "not a directory"),
    (["ui", "--port", "0"], "--port: got 0"),
    (["ui", "no-such-study"], "not a directory"),
    (["ls", "nowhere"], "ls: got 'nowhere'"),
    (["report", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args: list[str], needle: str) -> None:
    proc = run_cli_here(args, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "studies").exists()


@pytest.mark.parametrize("command", ["report", "export", "ui", "ls", "status"])
def test_every_command_has_help(tmp_path, command: str) -> None:
    proc = run_cli_here([command, "--help"], tmp_path)
    assert proc.returncode == 0 and "usage: autotune" in proc.stdout


def test_ls_with_no_studies_says_so(tmp_path) -> None:
    (tmp_path / "studies").mkdir()
    proc = run_cli_here(["ls"], tmp_path)
    assert proc.returncode == 0 and "no studies" in proc.stdout


@pytest.mark.parametrize(("params", "name"), [
    ({"model": "q4_0", "n_threads": 2, "flash_attn": True}, "#0007 model=q4_0 n_threads=2 flash_attn=True"),
    ({"n_threads": 1}, "#0007 n_threads=1"),  # a conditional parameter that is absent
])
def test_run_names_show_the_varying_parameters(params: dict, name: str) -> None:
    space = {"model": {"type": "categorical", "choices": ["q4_0"]}, "n_threads": {"type": "int"},
             "flash_attn": {"type": "bool"}, "n_ctx": {"type": "fixed", "value": 512}}
    assert varying_params(space) == ["model", "n_threads", "flash_attn"]
    assert run_name(7, {**params, "n_ctx": 512}, varying_params(space)) == name


def test_units_note_lists_units_and_directions() -> None:
    note = units_note(["decode_tps", "ttft_p95_ms", "not_a_metric"])
    assert "| `decode_tps` | tok/s | maximize |" in note and "| `ttft_p95_ms` | ms | minimize |" in note
    assert "not_a_metric" not in note


def _wait_exec(pid: int) -> None:
    """Wait until a just-forked child has exec'd (its /proc cmdline is its own)."""
    cmdline = Path(f"/proc/{pid}/cmdline")
    deadline = time.monotonic() + 30
    while b"sleep(60)" not in cmdline.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_running_pid_is_alive_autotune_only(tmp_path) -> None:
    from autotune.record.study_dirs import RUNNING_FILE
    from autotune.record.study_dirs import running_pid

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "autotune"])
    try:
        _wait_exec(proc.pid)
        (tmp_path / RUNNING_FILE).write_text(f"{proc.pid}\n")
        assert running_pid(tmp_path) == proc.pid
    finally:
        proc.kill()
        proc.wait()
    assert running_pid(tmp_path) is None  # the driver died: not running any more
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _wait_exec(other.pid)
        (tmp_path / RUNNING_FILE).write_text(f"{other.pid}\n")
        assert running_pid(tmp_path) is None  # a reused pid of another program
    finally:
        other.kill()
        other.wait()
