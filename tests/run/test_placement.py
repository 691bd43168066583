"""Placement on one Ray node with 4 fake GPUs: own GPUs per trial, faults, a killed worker.

Every test runs the real driver (Optuna ask/tell on SQLite in tmp_path, real Ray, real trial
subprocesses) on the fake engine, whose trials record from inside themselves what they saw.
"""

from __future__ import annotations

import os
import signal

import pytest

from autotune.engines.fake import FakeEngine
from tests.helpers.procs import parent
from tests.helpers.procs import process_alive
from tests.helpers.ray_cluster import WhenStarted
from tests.helpers.ray_cluster import fake_config
from tests.helpers.ray_cluster import gpu_overlaps
from tests.helpers.ray_cluster import max_concurrent
from tests.helpers.ray_cluster import run_study
from tests.helpers.ray_cluster import study_records
from tests.helpers.ray_cluster import trial_events
from tests.helpers.ray_cluster import wait_gone

FAULTS = {"crash": {"type": "bool"}, "hang": {"type": "bool"}, "oom": {"type": "bool"},
          "nan": {"type": "bool"}}


@pytest.mark.parametrize(("params", "settings", "ok"), [
    ({"gpus": 1}, {}, True),
    ({"gpus": 2}, {}, True),
    ({"gpus": 0.5}, {}, False),  # two trials would share a GPU: only if configured
    ({"gpus": 0.5}, {"share_gpus": True}, True),
    ({"gpus": 1.5}, {"share_gpus": True}, False),
    ({"gpus": 3}, {"gpus": [{"memory_gb": 24}] * 2}, False),
    ({"gpu_memory_gb": 30}, {"gpus": [{"memory_gb": 24}, {"memory_gb": 32}]}, True),
    ({"gpu_memory_gb": 40}, {"gpus": [{"memory_gb": 24}, {"memory_gb": 32}]}, False),
])
def test_fake_engine_check(params, settings, ok):
    assert (FakeEngine.check(params, settings) == []) is ok


@pytest.mark.parametrize(("params", "settings", "want"), [
    ({}, {}, (1.0, 1.0, {})),
    ({"gpus": 2, "cpus": 3}, {"gpus": [{}, {}]}, (3.0, 2.0, {})),
    ({"resource": "gpu_5090"}, {"resources": {"fast_disk": 1}},
     (1.0, 1.0, {"fast_disk": 1.0, "gpu_5090": 1.0})),
])
def test_fake_engine_resources(params, settings, want):
    res = FakeEngine.resources(params, settings)
    assert (res.num_cpus, res.num_gpus, res.custom) == want


@pytest.mark.slow
def test_trials_get_their_own_gpus(local_ray, tmp_path):
    cfg, space = fake_config(tmp_path, ["study.n_trials=8", "space.duration_s.value=1.0"])
    summary, log = run_study(cfg, space)
    finished, recs = study_records(cfg)
    assert finished == 8, log
    assert all(r.status in ("ok", "stopped") for r in recs.values()), log
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    events = trial_events(cfg)
    assert sorted(events) == list(range(8))
    for n, ev in events.items():
        devices = ev["start"]["cuda_visible_devices"].split(",")
        # the trial subprocess inherited exactly the GPUs Ray gave its task
        assert len(devices) == recs[n].params["gpus"], ev
        assert set(devices) <= {"0", "1", "2", "3"}
    assert gpu_overlaps(events) == []
    assert max_concurrent(events) >= 2, "trials never ran side by side"
    assert wait_gone([ev["start"]["pid"] for ev in events.values()]) == []


@pytest.mark.slow
def test_faults_become_failed_results_and_the_study_goes_on(local_ray, tmp_path):
    faults = [{"crash": True}, {"hang": True}, {"oom": True}, {"nan": True}]
    cfg, space = fake_config(tmp_path, ["study.n_trials=5", "study.trial_timeout_s=8"],
                             space=FAULTS, enqueue=faults)
    summary, log = run_study(cfg, space)
    finished, recs = study_records(cfg)
    assert finished == 5, log
    by_fault = {next((k for k in FAULTS if r.params.get(k)), "none"): r for r in recs.values()}
    assert by_fault["none"].status == "ok"
    assert by_fault["crash"].status == "failed"
    assert "exited with code 1" in by_fault["crash"].reason
    assert by_fault["hang"].status == "timeout"
    assert "timed out after 8 s" in by_fault["hang"].reason
    assert by_fault["oom"].status == "failed" and "out of memory" in by_fault["oom"].reason
    assert by_fault["nan"].status == "failed" and "not finite" in by_fault["nan"].reason
    assert summary["n_failed"] == 4 and summary["n_trials"] == 5
    pids = [ev["start"]["pid"] for ev in trial_events(cfg).values()]
    assert len(pids) == 5
    assert wait_gone(pids) == [], "a trial process outlived its trial"


@pytest.mark.slow
def test_killed_ray_worker_fails_only_its_trial(local_ray, tmp_path):
    space = {"duration_s": {"type": "categorical", "choices": [0.0, 1.5, 30.0]}}
    # three distinct short trials (a repeated configuration would not be launched again)
    enqueue = [{"duration_s": 30.0, "gpus": 2}] + [{"duration_s": 1.5, "x": x} for x in (0.1, 0.2, 0.3)]
    cfg, space = fake_config(tmp_path, ["study.n_trials=5"], space=space, enqueue=enqueue)
    died: dict[int, int] = {}  # trial -> the Ray worker killed

    def kill_worker(ev):
        # the Ray worker: parent of the guard's stub, the guard's parent (autotune.trial.guard)
        ray_worker = parent(parent(ev["ppid"]))
        os.kill(ray_worker, signal.SIGKILL)
        assert wait_gone([ev["pid"], ev["ppid"]], 10, poll_s=0.01) == [], "the trial outlived its Ray worker"
        died[int(ev["trial"])] = ray_worker

    killer = WhenStarted(str(tmp_path / "records"), lambda ev: ev["params"]["duration_s"] == 30.0,
                         kill_worker)
    killer.start()
    summary, log = run_study(cfg, space)
    killer.join(5)
    assert killer.event is not None, log
    victim = int(killer.event["trial"])
    finished, recs = study_records(cfg)
    assert finished == 5, log
    assert recs[victim].status == "failed"
    assert "Ray task lost" in recs[victim].reason, recs[victim].reason
    assert all(r.status in ("ok", "stopped") for n, r in recs.items() if n != victim), log
    assert victim in died and not process_alive(died[victim]) and not process_alive(killer.event["ppid"])
    events = trial_events(cfg)
    assert "end" not in events[victim]
    assert wait_gone([ev["start"]["pid"] for ev in events.values()]) == []
    # Ray frees a dead worker's GPUs at once; the GPU lease held by the orphaned trial
    # process keeps the next trial off that GPU until the orphan is really gone.
    assert gpu_overlaps(events, died) == []


LEASE_HOLDER = """
import subprocess, sys, time
from pathlib import Path
from autotune.run.cluster import gpu_lease
with gpu_lease("1", lease_dir=Path(sys.argv[1])) as fds:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=fds)
    print(child.pid, flush=True)
    time.sleep(60)
"""


def test_gpu_lease_outlives_a_killed_parent(tmp_path):
    """The proposed fix for the GPU hand-over gap: the lock lives as long as the trial."""
    import subprocess
    import sys

    from autotune.run.cluster import gpu_lease

    parent = subprocess.Popen([sys.executable, "-c", LEASE_HOLDER, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        parent.kill()  # like a Ray worker killed mid-trial
        parent.wait()
        with pytest.raises(TimeoutError, match="GPU 1 still used"):
            with gpu_lease("1", timeout_s=0.5, lease_dir=tmp_path):
                pass
        with gpu_lease("0", timeout_s=0.5, lease_dir=tmp_path):
            pass  # another GPU is free
    finally:
        os.kill(child, signal.SIGKILL)
    assert wait_gone([child], 5) == []
    with gpu_lease("1,0", timeout_s=5, lease_dir=tmp_path) as fds:
        assert len(fds) == 2


@pytest.mark.parametrize(("need", "cap", "n"), [
    ({"CPU": 1, "GPU": 1}, {"CPU": 8, "GPU": 4}, 4),
    ({"CPU": 1, "GPU": 2}, {"CPU": 8, "GPU": 4}, 2),
    ({"CPU": 1, "GPU": 2}, {"CPU": 8, "GPU": 1}, 0),
    ({"CPU": 1, "gpu_5090": 1}, {"CPU": 8, "GPU": 4}, 0),
    ({"CPU": 0.5}, {"CPU": 2}, 4),
])
def test_fits(need, cap, n):
    from autotune.run.cluster import fits

    assert fits(need, cap) == n


def test_resource_plan_flags_demands_that_never_fit(tmp_path):
    from autotune.run.cluster import resource_plan

    cfg, space = fake_config(tmp_path, ["ray.num_gpus=1"])
    plan = "\n".join(resource_plan(cfg, space))
    assert "CPU 1, GPU 2: 50% of configs, NEVER fits" in plan
    assert "CPU 1, GPU 1: 50% of configs, 1 at once" in plan
