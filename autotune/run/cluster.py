"""Cluster and resource-plan helpers: what trials reserve, what fits, GPU memory, GPU leases.

- :func:`resource_plan` lists the distinct resource demands of a space (CPUs, GPUs, custom
  Ray resources), how many trials of each fit at once on the configured capacity, and the
  demands that can never be scheduled (Ray would queue them forever).
- :func:`gpu_lease` holds an exclusive ``flock`` per assigned GPU index for as long as a
  trial process (and whatever inherits the lock's descriptor) lives, so a GPU that Ray frees
  when a worker dies is not used by the next trial before the orphaned trial has exited.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.hardware import cpu_count
from autotune.hardware import list_gpus

if TYPE_CHECKING:
    from collections.abc import Iterator

    from autotune.config.schema import Config
    from autotune.engines.base import Resources
    from autotune.search.space import Space

LEASE_DIR = Path(tempfile.gettempdir()) / "autotune-gpu-leases"


def capacity(cfg: Config) -> dict[str, float] | None:
    """CPU/GPU/custom capacity of a local Ray from the config; None when joining a cluster."""
    if cfg.ray.address:
        return None
    gpus = cfg.ray.num_gpus if cfg.ray.num_gpus is not None else len(list_gpus())
    return {"CPU": float(cfg.ray.num_cpus or cpu_count()), "GPU": float(gpus),
            **{k: float(v) for k, v in cfg.ray.resources.items()}}


def demand(res: Resources) -> dict[str, float]:
    """A Resources record as Ray's resource dict (zero amounts left out)."""
    out = {"CPU": float(res.num_cpus), "GPU": float(res.num_gpus), **res.custom}
    return {k: v for k, v in out.items() if v}


def fits(need: dict[str, float], cap: dict[str, float]) -> int:
    """How many trials with ``need`` run at once on ``cap`` (0: never schedulable)."""
    counts = [math.floor(cap.get(k, 0.0) / v + 1e-9) for k, v in need.items() if v > 0]
    return min(counts) if counts else 1_000_000


def resource_plan(cfg: Config, space: Space, limit: int = 2_000) -> list[str]:
    """Human-readable lines: capacity, each distinct demand with its share and concurrency."""
    cap = capacity(cfg)
    seen: Counter[tuple] = Counter()
    for i, params in enumerate(space.configurations()):
        if i >= limit:
            break
        if space.violations(params):
            continue
        need = demand(space.engine.resources(params, cfg.engine.settings))
        seen[tuple(sorted(need.items()))] += 1
    total = sum(seen.values()) or 1
    lines = ["capacity: " + (f"Ray cluster at {cfg.ray.address} (known when it runs)" if cap is None
                             else ", ".join(f"{k} {v:g}" for k, v in cap.items() if v))]
    for key, n in seen.most_common():
        need = dict(key)
        text = ", ".join(f"{k} {v:g}" for k, v in need.items()) or "nothing"
        share = f"{100 * n / total:.0f}% of configs"
        if cap is None:
            lines.append(f"  {text}: {share}")
            continue
        k = fits(need, cap)
        lines.append(f"  {text}: {share}, " + (f"{k} at once" if k else
                                                "NEVER fits: Ray would queue it forever"))
    slots = cfg.ray.max_concurrent
    lines.append(f"trials in flight: {slots or 'as many as the resources allow'}")
    return lines


@contextlib.contextmanager
def gpu_lease(cuda_visible_devices: str | None, timeout_s: float = 60.0,
              lease_dir: Path = LEASE_DIR) -> Iterator[list[int]]:
    """Lock each GPU index in ``cuda_visible_devices``; yields the lock descriptors.

    Pass the descriptors to the trial subprocess (``subprocess.Popen(pass_fds=...)``): the
    kernel keeps an ``flock`` until every descriptor sharing it is closed, so the lock lives
    exactly as long as the trial's process tree, even when the Ray worker holding the other
    copy is killed. Raises TimeoutError if a GPU stays locked ``timeout_s`` (a stuck orphan).
    Indices are per node: the lock directory is local to the machine.
    """
    ids = sorted({d.strip() for d in (cuda_visible_devices or "").split(",") if d.strip()})
    lease_dir.mkdir(parents=True, exist_ok=True)
    fds: list[int] = []
    try:
        for gpu in ids:
            fd = os.open(lease_dir / f"gpu{gpu}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            fds.append(fd)
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"GPU {gpu} still used by an earlier trial after "
                                           f"{timeout_s:g} s (lock {lease_dir}/gpu{gpu}.lock)") from None
                    time.sleep(0.05)
        yield fds
    finally:
        for fd in fds:
            os.close(fd)
