"""A study's stop ends the trials in flight (Placement.stop_all): on the Ray the placement
started, by shutting that Ray down, never by a cancel through Ray's task manager (ray 2.60's
cancel can race a completion reply and abort the driver); on a Ray someone else started, by
cancelling the tasks and leaving that Ray up. Either way the trial's whole process group dies."""

from __future__ import annotations

import signal
import time

import pytest

from autotune.engines.fake import FakeEngine
from autotune.run import stop
from autotune.run.launcher import Launcher
from tests.helpers.ray_cluster import RAY_INIT
from tests.helpers.ray_cluster import fake_config
from tests.helpers.ray_cluster import trial_events
from tests.helpers.ray_cluster import wait_gone

pytestmark = pytest.mark.slow


@pytest.fixture
def no_ray():
    """No Ray in this process before and after the test; the stop handlers as they were."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    saved = {s: signal.getsignal(s) for s in stop.SIGNALS}
    yield ray
    if ray.is_initialized():
        ray.shutdown()
    for s, h in saved.items():
        signal.signal(s, h)


def _start_long_trials(tmp_path, placement, n: int = 2) -> tuple[list, list[int]]:
    """Submit ``n`` 60 s fake trials; (refs, their worker pids) once every one has started."""
    cfg, _ = fake_config(tmp_path)
    launcher = Launcher(cfg, FakeEngine, placement)
    refs = [launcher.submit(i, {"duration_s": 60.0, "x": i / 10}) for i in range(n)]
    deadline = time.monotonic() + 120
    while len(events := trial_events(cfg)) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(events) == n, events
    return refs, [ev["start"]["pid"] for ev in events.values()]


def test_stop_all_shuts_down_its_own_ray_and_every_trial_dies(no_ray, tmp_path):
    from autotune.config.schema import RayConfig
    from autotune.run.placement import Placement

    placement = Placement(RayConfig(num_cpus=4, num_gpus=4))
    assert placement.owns_ray
    stop.install()
    ours = signal.getsignal(signal.SIGTERM)
    refs, pids = _start_long_trials(tmp_path, placement)
    t0 = time.monotonic()
    placement.stop_all(refs)
    assert not no_ray.is_initialized()
    assert wait_gone(pids, timeout_s=15) == [], "a trial outlived the stop"
    assert time.monotonic() - t0 < 30
    # ray.shutdown leaves our handlers: a second stop still exports
    assert signal.getsignal(signal.SIGTERM) is ours
    placement.shutdown()  # the driver's own shutdown afterwards is harmless


def test_stop_all_cancels_on_a_ray_it_did_not_start_and_leaves_it_up(no_ray, tmp_path):
    from autotune.config.schema import RayConfig
    from autotune.run.placement import Placement

    no_ray.init(address="local", num_cpus=4, num_gpus=4, **RAY_INIT)
    placement = Placement(RayConfig())
    assert not placement.owns_ray
    refs, pids = _start_long_trials(tmp_path, placement)
    placement.stop_all(refs)
    assert no_ray.is_initialized()
    assert wait_gone(pids, timeout_s=15) == [], "a cancelled trial outlived its task"
    assert no_ray.get(no_ray.remote(lambda: 7).remote(), timeout=60) == 7  # that Ray still works
