"""SIGTERM and SIGHUP stop a study as Ctrl-C does; a second driver of a running study is refused.

Real drivers (``autotune run`` on the fake engine) in subprocesses: a signal mid-trial gives
exit 143 / 129, the summary and exports written, no trial left RUNNING, no native stack dump
and no process left behind; a second ``autotune run`` of the same study (in the test's own
process: the lock is the first one's) exits 2 with the holder's line while the first one
finishes normally.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState

from autotune.record.optuna_study import INTERRUPTED
from tests.conftest import study_overrides
from tests.helpers.cli import run_cli_here
from tests.helpers.procs import children
from tests.helpers.procs import processes_with_arg

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def fake_study(tmp_path, name: str, n_trials: int, duration_s: float) -> list[str]:
    """``autotune run`` arguments for a fake-engine study whose trials take ``duration_s``."""
    return ["run", "conf=fake_gpus", f"study.n_trials={n_trials}", f"space.duration_s.value={duration_s}",
            "study.trial_timeout_s=120", "report.enabled=false",
            *study_overrides(tmp_path, name, seed_mlflow=True)]


def start(tmp_path, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "autotune.cli", *args], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"})


def wait_for(proc: subprocess.Popen, text: str, timeout_s: float = 300) -> list[str]:
    """Read ``proc``'s output until a line contains ``text``; the lines read."""
    lines, deadline = [], time.monotonic() + timeout_s
    for line in proc.stdout:
        lines.append(line)
        if text in line or time.monotonic() > deadline:
            break
    return lines


def trials(d, name: str) -> list[optuna.trial.FrozenTrial]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=name, storage=f"sqlite:///{d / 'optuna.db'}").trials


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_signal_mid_trial_stops_like_ctrl_c(tmp_path, sig, code):
    name = f"sig{code}"
    proc = start(tmp_path, fake_study(tmp_path, name, 6, 30.0))
    try:
        lines = wait_for(proc, "#0 started")
        time.sleep(3.0)  # Ray has installed its handlers; trials are mid-measurement
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines) + out
    assert proc.returncode == code, text[-3000:]
    assert "Stack trace" not in text and "SIGABRT" not in text and "Traceback" not in text, text[-3000:]
    assert f"interrupted ({signal.Signals(sig).name})" in text
    d = tmp_path / "studies" / name
    summary = json.loads((d / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert (d / "pareto.json").exists()
    ts = trials(d, name)
    assert not [t for t in ts if t.state == TrialState.RUNNING]
    assert [t for t in ts if t.user_attrs.get("kind") == INTERRUPTED]
    assert not (d / ".running").exists()
    time.sleep(2.0)
    assert processes_with_arg(str(d)) == [], "a trial process outlived the stopped study"


def test_second_driver_is_refused_and_the_first_finishes(tmp_path):
    # no re-measurement (select.top_k=0): the point is the lock, held from the first trial on
    args = [*fake_study(tmp_path, "twice", 2, 10.0), "select.top_k=0"]
    first = start(tmp_path, args)
    try:
        lines = wait_for(first, "#0 started")
        # in this process: the lock is the other process's flock; the entry point is proven above
        listed = run_cli_here(["ls", "studies"], tmp_path)  # readers never take the lock
        second = run_cli_here(args, tmp_path)
        out, _ = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert listed.returncode == 0 and "running" in listed.stdout, listed.stdout + listed.stderr
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    err = second.stderr.strip().splitlines()
    assert len(err) == 1 and f"pid {first.pid}" in err[0] and f"kill {first.pid}" in err[0], err
    assert "study.name=" in err[0]
    text = "".join(lines) + out
    assert first.returncode == 0, text[-3000:]
    d = tmp_path / "studies" / "twice"
    ts = trials(d, "twice")
    assert sum(t.user_attrs.get("kind") == "launched" for t in ts) == 2  # not more than asked
    assert json.loads((d / "summary.json").read_text())["interrupted"] is False


@pytest.mark.parametrize("when", ["study_started", "ray_starting"])
def test_sigterm_during_start_up_exits_143_and_leaves_nothing(tmp_path, when):
    """A SIGTERM once ``.running`` is written (MLflow and Ray not up yet), or while ``ray.init``
    runs (Ray's own handler would ``sys.exit(15)``): exit 143, no ``.running``, no process."""
    d = tmp_path / "studies" / "early"
    proc = subprocess.Popen([sys.executable, "-m", "autotune.cli",
                             *fake_study(tmp_path, "early", 4, 10.0)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    started = (lambda: (d / ".running").exists()) if when == "study_started" else (lambda: children(proc.pid))
    try:
        deadline = time.monotonic() + 120
        while not started() and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, out[-3000:]
    assert "interrupted (SIGTERM)" in out and "Traceback" not in out, out[-3000:]
    assert not (d / ".running").exists()
    deadline = time.monotonic() + 30
    while processes_with_arg(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_with_arg(str(tmp_path)) == []


LATE_SIGTERM = """
import os, signal, sys, time
from autotune.run import placement, stop  # placement first: it turns Ray's native handler off
stop.install(fresh=True)
try:
    with stop.ray_start():
        placement.ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
        os.kill(os.getpid(), signal.SIGTERM)  # the core worker is up: Ray's native handler's window
        time.sleep(2)
    stop.check()
except stop.Stopped as e:
    sys.exit(128 + e.signum)
sys.exit(1)
"""


def test_sigterm_once_rays_core_worker_is_up_is_a_clean_stop(tmp_path):
    """A SIGTERM after Ray's core worker started inside ``ray.init`` (before the driver takes
    the signals back) reaches our stop, with no native stack dump: Abseil's handler, which Ray
    installs there, dumped a stack every time and once aborted a CI soak's driver (exit -6)."""
    proc = subprocess.run([sys.executable, "-c", LATE_SIGTERM], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={k: v for k, v in os.environ.items()
                                                       if k != "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 143, out[-3000:]
    assert "*** SIG" not in out, out[-3000:]
