"""Ray placement: each trial reserves the CPUs/GPUs/custom resources its parameters need.

Local embedded Ray by default; ``ray.address`` joins a cluster. Workers only receive a
TrialSpec as JSON and return a TrialResult as JSON; Optuna and MLflow stay in the driver.
A GPU trial's subprocess inherits the ``CUDA_VISIBLE_DEVICES`` Ray assigned to its task.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING
from typing import Any

# Ray's C++ failure-signal handler (Abseil's) takes SIGTERM in the driver from the moment its
# core worker starts inside ray.init until stop.install() takes it back: it dumps a native stack
# (a clean stop must not) and once aborted the driver (a clean-clone CI soak: exit -6, not 143).
# Ray's own switch, read when ray is imported; a native crash still ends the process.
os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")

import ray  # noqa: E402 - after the switch above

from autotune.hardware import cpu_count
from autotune.run import stop
from autotune.run.cluster import LEASE_DIR
from autotune.run.cluster import gpu_lease
from autotune.trial.runner import run_trial
from autotune.trial.spec import TrialResult
from autotune.trial.spec import TrialSpec

if TYPE_CHECKING:
    from autotune.config.schema import RayConfig
    from autotune.engines.base import Resources


def _run_remote(spec_json: str) -> str:
    """The Ray task: run one trial in an isolated subprocess; JSON in, JSON out."""
    spec = TrialSpec.from_json(spec_json)
    gpus = ",".join(str(g) for g in ray.get_gpu_ids())
    if not gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # reserved no GPU: must not see any
    node_dir = LEASE_DIR / ray.get_runtime_context().get_node_id()[:16]
    try:
        # The lock lives as long as the trial's process, even if this Ray worker is killed,
        # so a GPU is never handed to the next trial while an orphan still holds it.
        with gpu_lease(gpus, timeout_s=spec.timeout_s, lease_dir=node_dir) as fds:
            result = run_trial(spec, pass_fds=fds)
    except TimeoutError as e:
        result = TrialResult(spec.number, "failed", reason=str(e))
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        result = result.replace(info={**result.info, "cuda_visible_devices": cvd})
    return result.to_json()


RAY_TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"


class Placement:
    """Submits trials to Ray and collects their results. Owned by the driver thread."""

    def __init__(self, cfg: RayConfig) -> None:
        self.ray = ray
        self.owns_ray = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                      "logging_level": logging.WARNING}
            if cfg.runtime_env:
                kwargs["runtime_env"] = cfg.runtime_env
            with stop.ray_start():  # a SIGTERM during Ray's start-up stops the study as ours do
                if cfg.address:
                    ray.init(address=cfg.address, **kwargs)
                else:
                    # address="local": always a fresh embedded instance, never a head found on this box.
                    # Its token authentication (Ray's default) stays; Ray's line announcing it does not
                    # open every run's console
                    logging.getLogger(RAY_TOKEN_LOGGER).setLevel(logging.ERROR)
                    ray.init(address="local", num_cpus=cfg.num_cpus or cpu_count(),
                             num_gpus=cfg.num_gpus, resources=cfg.resources or None, **kwargs)
            self.owns_ray = True
        # max_calls=0: reuse Ray workers across trials (each trial runs in its own subprocess,
        # so a worker holds no GPU memory; Ray's default for GPU tasks is a new process each)
        self._task = ray.remote(max_retries=0, max_calls=0)(_run_remote)

    def capacity(self) -> dict[str, float]:
        return dict(self.ray.cluster_resources())

    def default_slots(self) -> int:
        res = self.capacity()
        if res.get("GPU", 0) >= 1:
            return int(res["GPU"])
        return max(1, int(res.get("CPU", 1)))

    def fits(self, res: Resources) -> str:
        """'' if the cluster could ever hold ``res``, else why it never can."""
        cap = self.capacity()
        need = {"CPU": res.num_cpus, "GPU": res.num_gpus, **res.custom}
        short = [f"{k} {v:g} (cluster has {cap.get(k, 0):g})" for k, v in need.items() if v and v > cap.get(k, 0)]
        return ("needs " + ", ".join(short)) if short else ""

    def submit(self, spec: TrialSpec, res: Resources):
        opts: dict[str, Any] = {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus}
        if res.custom:
            opts["resources"] = dict(res.custom)
        return self._task.options(**opts).remote(spec.to_json())

    def wait(self, refs: list, timeout_s: float) -> list:
        ready, _ = self.ray.wait(refs, num_returns=1, timeout=timeout_s)
        return ready

    def wait_all_done(self, refs: list) -> list:
        """Those of ``refs`` that are already finished (no waiting)."""
        if not refs:
            return []
        return self.ray.wait(refs, num_returns=len(refs), timeout=0)[0]

    def result(self, ref, number: int) -> TrialResult:
        """The trial's result; a lost worker or node becomes a failed result with the reason."""
        try:
            return TrialResult.from_json(self.ray.get(ref, timeout=60))
        except Exception as e:  # noqa: BLE001 - worker died, node lost, task cancelled
            reason = " ".join(str(e).split())[:500]
            return TrialResult(number, "failed", reason=f"Ray task lost: {type(e).__name__}: {reason}")

    def cancel(self, ref) -> None:
        try:
            self.ray.cancel(ref, force=True)
        except Exception:  # noqa: BLE001 - already finished or gone
            pass

    def stop_all(self, refs: list) -> None:
        """Stop every trial in flight at once (a study's stop). A Ray this placement started is
        shut down: that ends its workers, and each trial's guard then kills the trial's process
        group (autotune.trial.guard), a reference measurement's too. No task is cancelled
        through Ray there: ray 2.60's cancel can race a task's completion reply and abort the
        driver on an internal check ("Tried to complete task that was not pending",
        ray-project/ray#54798), as a soak's Ctrl-C did. A Ray someone else started keeps
        running; ``refs`` are cancelled on it."""
        if not self.owns_ray:
            for ref in refs:
                self.cancel(ref)
            return
        self.shutdown()  # our stop handlers stay: a second stop still exports

    def run_now(self, spec: TrialSpec, res: Resources) -> TrialResult:
        """Run one trial and wait for it (reference measurement, re-measurement)."""
        ref = self.submit(spec, res)
        ready = self.ray.wait([ref], timeout=spec.timeout_s + 120)[0]
        if not ready:
            self.cancel(ref)
            return TrialResult(spec.number, "timeout", reason="no result from Ray in time")
        return self.result(ref, spec.number)

    def shutdown(self) -> None:
        if self.owns_ray:
            self.ray.shutdown()
