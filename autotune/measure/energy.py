"""Energy per output token from the hardware's energy counters: NVML per GPU, RAPL on CPU.

:func:`find_counters` returns the counters a trial can read: NVML's total-energy counter
(``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded) of each GPU the
trial uses (its ``CUDA_VISIBLE_DEVICES``), and the RAPL package domains under
``/sys/class/powercap`` (``energy_uj``, wrapping at ``max_energy_range_uj``) where they are
readable (on many Linux systems only root may read them). Each counts a whole device:
other processes on the same GPU or CPU package are counted too.

:class:`EnergyMeter` first reads the counters across ``idle_s`` seconds with the engine
loaded and idle (its idle power), then across the measurement; the energy above idle is
``sum(counter delta - idle power * duration)``. :func:`energy_metrics` divides it by the
output tokens the measurement generated (the warm-up requests' ``max_tokens`` included), as
``energy_j_per_token``. Where no counter is readable the metric is absent and
:func:`find_counters` says why in one line.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Protocol

from autotune.hardware import list_gpus
from autotune.hardware import visible_nvml_indices

POWERCAP = Path("/sys/class/powercap")
IDLE_S = 1.0


class Counter(Protocol):
    """A cumulative energy counter: ``read_j()`` is joules since some fixed origin."""

    name: str

    def read_j(self) -> float: ...


@dataclass
class RaplCounter:
    """One RAPL domain (``intel-rapl:0``: a CPU package); unwraps ``energy_uj`` overflows."""

    path: Path
    name: str = ""
    _last: int | None = None
    _wraps: int = 0
    _range: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.name = self.name or f"RAPL {(self.path / 'name').read_text().strip()}"
        self._range = int((self.path / "max_energy_range_uj").read_text())

    def read_j(self) -> float:
        uj = int((self.path / "energy_uj").read_text())
        if self._last is not None and uj < self._last:
            self._wraps += 1
        self._last = uj
        return (uj + self._wraps * (self._range + 1)) / 1e6


@dataclass
class NvmlCounter:
    """One GPU's total energy counter through NVML (millijoules since the driver loaded)."""

    index: int
    name: str = ""

    def __post_init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._h = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        self._read = pynvml.nvmlDeviceGetTotalEnergyConsumption
        self._read(self._h)  # raises NVMLError_NotSupported on GPUs without the counter
        self.name = self.name or f"NVML GPU {self.index}"

    def read_j(self) -> float:
        return self._read(self._h) / 1e3


def rapl_counters(root: Path = POWERCAP) -> tuple[list[RaplCounter], str]:
    """The readable RAPL package domains under ``root``, or ([], why not)."""
    domains = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1) if root.is_dir() else []
    if not domains:
        return [], f"RAPL: no package domain under {root}"
    try:
        out = [RaplCounter(p) for p in domains]
        for c in out:
            c.read_j()
    except (OSError, ValueError) as e:
        return [], f"RAPL unreadable ({type(e).__name__}: {e}; reading energy_uj often needs root)"
    return out, ""


def nvml_counters() -> tuple[list[NvmlCounter], str]:
    """NVML energy counters of this process's GPUs (``CUDA_VISIBLE_DEVICES``), or ([], why not)."""
    gpus = list_gpus()
    if not gpus:
        return [], "NVML: no GPU"
    indices = visible_nvml_indices(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus)
    if not indices:
        return [], "NVML: the trial uses no GPU"
    try:
        return [NvmlCounter(i) for i in indices], ""
    except Exception as e:  # noqa: BLE001 - NVMLError_NotSupported on older GPUs
        return [], f"NVML energy counter unreadable ({type(e).__name__})"


def find_counters(root: Path = POWERCAP) -> tuple[list[Counter], str]:
    """Every readable counter of this trial (GPUs first), or ([], a one-line reason)."""
    gpu, why_gpu = nvml_counters()
    cpu, why_cpu = rapl_counters(root)
    counters: list[Counter] = [*gpu, *cpu]
    if counters:
        return counters, ""
    return [], f"no energy counter readable here: {why_gpu}; {why_cpu}"


class EnergyMeter:
    """Joules above idle over a ``with`` block (see the module docstring).

    ``counters`` come from :func:`find_counters` (or a test's fake); ``clock`` and ``sleep``
    replace ``time.monotonic`` / ``time.sleep`` in tests. Not thread-safe.
    """

    def __init__(self, counters: list[Counter], idle_s: float = IDLE_S,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.counters, self.idle_s, self.clock, self.sleep = counters, idle_s, clock, sleep
        self.idle_w: list[float] = []
        self.net_j: float | None = None
        self.seconds = 0.0
        self._start: list[float] = []
        self._t0 = 0.0

    def _read(self) -> list[float]:
        return [c.read_j() for c in self.counters]

    def __enter__(self) -> EnergyMeter:
        if not self.counters:
            return self
        t, e = self.clock(), self._read()
        self.sleep(self.idle_s)
        t1, e1 = self.clock(), self._read()
        self.idle_w = [(b - a) / max(t1 - t, 1e-9) for a, b in zip(e, e1)]
        self._t0, self._start = t1, e1
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.counters:
            return
        t, e = self.clock(), self._read()
        self.seconds = t - self._t0
        self.net_j = sum(max(0.0, (b - a) - w * self.seconds)
                         for a, b, w in zip(self._start, e, self.idle_w))

    def describe(self) -> str:
        """Which counters, and that each counts its whole device with idle subtracted."""
        names = " + ".join(c.name for c in self.counters)
        idle = sum(self.idle_w)
        return (f"{names}: whole devices, idle {idle:.1f} W measured over {self.idle_s:g} s "
                "before the measurement and subtracted")


def measured_tokens(raw: dict, warmup_tokens: int = 0) -> int:
    """Output tokens a measurement generated: every SLO-search level's (throughput x wall),
    else the measured requests'; plus ``warmup_tokens``."""
    levels = raw.get("search")
    if levels:
        total = sum(r.get("aggregate_tps", 0.0) * r.get("wall_s", 0.0) for r in levels)
    else:
        total = sum(raw.get("output_tokens") or [])
    return int(round(total)) + warmup_tokens


def energy_metrics(meter: EnergyMeter, tokens: int) -> dict[str, float]:
    """``energy_j_per_token`` ({} without counters or tokens)."""
    if meter.net_j is None or tokens <= 0:
        return {}
    return {"energy_j_per_token": meter.net_j / tokens}
