"""Trials across machines: joining a running Ray head, two fake-GPU nodes, a node that dies.

All on 127.0.0.1: a real ``ray start --head`` process joined by address, and a
``ray.cluster_utils.Cluster`` whose nodes each have their own raylet and fake GPUs (a node
is told apart inside a trial by its ``RAY_RAYLET_PID``). Every process started here is
stopped here, by pid (never ``ray stop``, which would stop other users' Ray too).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.procs import process_alive
from tests.helpers.ray_cluster import HEAD_AUTH_MODE
from tests.helpers.ray_cluster import RAY_INIT
from tests.helpers.ray_cluster import WhenStarted
from tests.helpers.ray_cluster import fake_config
from tests.helpers.ray_cluster import gpu_overlaps
from tests.helpers.ray_cluster import loopback_only
from tests.helpers.ray_cluster import run_study
from tests.helpers.ray_cluster import study_records
from tests.helpers.ray_cluster import trial_events
from tests.helpers.ray_cluster import wait_gone

pytestmark = pytest.mark.slow
RESOURCE = {"resource": {"type": "categorical", "choices": ["", "gpu_5090", "doomed"]}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pids_under(temp_dir: str) -> list[int]:
    """Processes whose command line mentions ``temp_dir`` (the head's own processes)."""
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if temp_dir.encode() in (entry / "cmdline").read_bytes():
                out.append(int(entry.name))
        except OSError:
            continue
    return [p for p in out if p != os.getpid()]


def _stop_head(temp_dir: str) -> None:
    pids = _pids_under(temp_dir)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        pids = wait_gone(pids, 10)
        if not pids:
            return


@pytest.fixture
def head():
    """``ray start --head`` on 127.0.0.1 (4 CPUs, 2 fake GPUs); yields (port, its temp dir) and
    stops its processes by pid afterwards."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    if not loopback_only():
        pytest.skip("ray was imported before tests.helpers.ray_cluster: set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0")
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="atray", dir="/tmp")  # short: unix socket paths
    argv = [str(Path(sys.executable).parent / "ray"), "start", "--head", f"--port={port}",
            "--node-ip-address=127.0.0.1", "--num-cpus=4", "--num-gpus=2",
            "--include-dashboard=false", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    try:
        started = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                                 env={**os.environ, "RAY_AUTH_MODE": HEAD_AUTH_MODE})
        assert started.returncode == 0, started.stdout + started.stderr
        yield port, temp_dir
    finally:
        if ray.is_initialized():
            ray.shutdown()
        _stop_head(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert _pids_under(temp_dir) == []


def test_join_a_running_head_by_address(head, tmp_path):
    """A fake study with ray.address=127.0.0.1:PORT runs its trials on that head."""
    import ray

    port, temp_dir = head
    cfg, space = fake_config(tmp_path, ["study.n_trials=3", f"ray.address=127.0.0.1:{port}",
                                        "ray.num_gpus=null", "ray.num_cpus=null"])
    summary, log = run_study(cfg, space)  # Placement joins, then disconnects
    assert not ray.is_initialized()
    finished, recs = study_records(cfg)
    assert finished == 3 and all(r.status in ("ok", "stopped") for r in recs.values()), log
    events = trial_events(cfg)
    head_raylets = {ev["start"]["raylet_pid"] for ev in events.values()}
    assert len(head_raylets) == 1 and int(head_raylets.pop()) in _pids_under(temp_dir)
    assert all(ev["start"]["cuda_visible_devices"] for ev in events.values())


def test_a_stop_ends_the_trials_on_a_joined_head_and_leaves_the_head_up(head, tmp_path):
    """A study's stop on a cluster it joined (Placement.stop_all): the driver disconnects,
    Ray ends the job's workers on the head, each trial's guard kills its process group; the
    head itself keeps running (it is not the study's to stop)."""
    import ray

    from autotune.engines.fake import FakeEngine
    from autotune.run.launcher import Launcher
    from autotune.run.placement import Placement

    port, temp_dir = head
    cfg, _ = fake_config(tmp_path, [f"ray.address=127.0.0.1:{port}", "ray.num_gpus=null", "ray.num_cpus=null"])
    placement = Placement(cfg.ray)
    launcher = Launcher(cfg, FakeEngine, placement)
    refs = [launcher.submit(i, {"duration_s": 60.0, "x": i / 10}) for i in range(2)]
    deadline = time.monotonic() + 120
    while len(events := trial_events(cfg)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(events) == 2, events
    head_pids = _pids_under(temp_dir)
    placement.stop_all(refs)
    assert not ray.is_initialized()
    assert wait_gone([ev["start"]["pid"] for ev in events.values()], timeout_s=30) == [], \
        "a trial outlived its study's stop on the cluster"
    raylet = int(next(iter(events.values()))["start"]["raylet_pid"])
    assert raylet in head_pids and process_alive(raylet), "the head went down with the study"


@pytest.fixture(scope="module")
def cluster():
    """Two nodes with 2 fake GPUs each; the second also has 2 units of ``gpu_5090``."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 4, "num_gpus": 2, "include_dashboard": False})
    second = c.add_node(num_cpus=4, num_gpus=2, resources={"gpu_5090": 2})
    try:
        ray.init(address=c.address, **RAY_INIT)
        c.wait_for_nodes()
        yield c, second
    finally:
        ray.shutdown()
        c.shutdown()


def _raylet_pid(node) -> str:
    from ray._private import ray_constants

    return str(node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid)


def test_trials_spread_over_nodes_on_disjoint_gpus(cluster, tmp_path):
    c, second = cluster
    enqueue = [{"resource": "gpu_5090", "gpus": 2}, {"resource": "gpu_5090", "gpus": 1}]
    space = {"resource": {"type": "categorical", "choices": ["", "gpu_5090"]}}
    cfg, space = fake_config(tmp_path, ["study.n_trials=10", "space.duration_s.value=1.5"],
                             space=space, enqueue=enqueue)
    summary, log = run_study(cfg, space)
    finished, recs = study_records(cfg)
    assert finished == 10 and all(r.status in ("ok", "stopped") for r in recs.values()), log
    events = trial_events(cfg)
    nodes = {ev["start"]["raylet_pid"] for ev in events.values()}
    assert len(nodes) == 2, "trials did not spread over both nodes"
    for n, ev in events.items():
        devices = ev["start"]["cuda_visible_devices"].split(",")
        assert len(devices) == recs[n].params["gpus"] and set(devices) <= {"0", "1"}, ev
        if recs[n].params.get("resource") == "gpu_5090":
            assert ev["start"]["raylet_pid"] == _raylet_pid(second), "custom resource ignored"
    assert gpu_overlaps(events) == []
    assert wait_gone([ev["start"]["pid"] for ev in events.values()]) == []


def test_a_node_that_dies_fails_only_its_trial(cluster, tmp_path):
    c, _ = cluster
    doomed = c.add_node(num_cpus=2, num_gpus=1, resources={"doomed": 1})
    c.wait_for_nodes()
    space = {**RESOURCE, "duration_s": {"type": "categorical", "choices": [0.0, 2.0, 60.0]}}
    # distinct configurations: a repeat of a measured one is not launched again
    enqueue = [{"resource": "doomed", "duration_s": 60.0}] + [{"duration_s": 2.0, "x": x} for x in (0.1, 0.2, 0.3)]
    cfg, space = fake_config(tmp_path, ["study.n_trials=5"], space=space, enqueue=enqueue)
    killer = WhenStarted(str(tmp_path / "records"), lambda ev: ev["params"]["resource"] == "doomed",
                         lambda ev: c.remove_node(doomed, allow_graceful=False))
    killer.start()
    t0 = time.monotonic()
    summary, log = run_study(cfg, space)
    elapsed = time.monotonic() - t0
    killer.join(5)
    assert killer.event is not None, log
    victim = int(killer.event["trial"])
    finished, recs = study_records(cfg)
    assert finished == 5, log
    assert recs[victim].status == "failed" and "Ray task lost" in recs[victim].reason, log
    assert all(r.status in ("ok", "stopped") for n, r in recs.items() if n != victim), log
    assert elapsed < 55, f"the driver waited {elapsed:.0f} s for a dead node"
    assert not process_alive(killer.event["ppid"])
    assert wait_gone([ev["start"]["pid"] for ev in trial_events(cfg).values()]) == []
