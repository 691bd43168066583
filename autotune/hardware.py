"""GPU inventory via NVML (nvidia-ml-py): names, memory, PCI bus ids, and VRAM sampling.

Works on machines without a GPU: :func:`list_gpus` returns ``[]`` when NVML is absent.

Units: GPU memory is in GiB (2**30 bytes) everywhere in autotune, which is what
``nvidia-smi`` shows (MiB / 1024), what a card's box calls "GB" (an RTX 4090 "24 GB" has
24 GiB), and what exllamav2's ``gpu_split`` means (``exllamav2/model.py::set_device_map``
multiplies by ``1024**3``). The keys keep the ``_gb`` spelling.

NVML numbers devices in PCI bus order and ignores ``CUDA_VISIBLE_DEVICES``; CUDA numbers
them fastest-first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. The trial workers set
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (:func:`pci_bus_order_env`), and :func:`visible_nvml_indices`
maps the trial's ``CUDA_VISIBLE_DEVICES`` to NVML indices through the PCI bus ids, so the
:class:`VramSampler` of a trial reads only that trial's GPUs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

GIB = float(1 << 30)


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    memory_gb: float  # GiB
    pci_bus_id: str = ""
    uuid: str = ""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def list_gpus() -> list[GPU]:
    """All GPUs NVML sees (NVML index order = PCI bus order), total memory in GiB; [] without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound and friends
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            pci = _text(pynvml.nvmlDeviceGetPciInfo(h).busId)
            out.append(GPU(i, _text(pynvml.nvmlDeviceGetName(h)), pynvml.nvmlDeviceGetMemoryInfo(h).total / GIB,
                           pci, _text(pynvml.nvmlDeviceGetUUID(h))))
        return out
    finally:
        pynvml.nvmlShutdown()


def pci_bus_order_env() -> dict[str, str]:
    """The environment that makes CUDA number devices as NVML does (set before CUDA starts)."""
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _bus_key(pci_bus_id: str) -> str:
    # NVML writes "00000000:17:00.0", CUDA "0000:17:00.0": compare without the domain's padding
    return pci_bus_id.lower().split(":", 1)[-1] if ":" in pci_bus_id else pci_bus_id.lower()


def visible_nvml_indices(visible: str | None, gpus: list[GPU]) -> list[int]:
    """NVML indices of the devices a CUDA process with ``CUDA_VISIBLE_DEVICES=visible`` uses.

    ``visible`` None means every device. Entries are CUDA ordinals (in PCI bus order, as
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes them) or ``GPU-<uuid>`` prefixes; as in CUDA,
    parsing stops at the first entry that names no device. MIG entries are not resolved.
    """
    by_bus = sorted(gpus, key=lambda g: _bus_key(g.pci_bus_id))
    if visible is None:
        return [g.index for g in by_bus]
    out: list[int] = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.isdigit() and int(entry) < len(by_bus):
            gpu = by_bus[int(entry)]
        elif entry.startswith("GPU-"):
            gpu = next((g for g in gpus if g.uuid and g.uuid.startswith(entry)), None)
        else:
            gpu = None
        if gpu is None:
            break
        if gpu.index not in out:
            out.append(gpu.index)
    return out


def _nvml_readers() -> tuple[Callable[[int], float], Callable[[int], float], Callable[[], None]] | None:
    """(read used bytes of NVML index i, read its total bytes, shutdown), or None without NVML.

    Uses the v2 memory struct when the driver has it: its ``used`` leaves out the memory the
    driver reserves, as ``nvidia-smi`` does; the v1 struct counts it as used.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001
        return None
    handles: dict[int, object] = {}

    def info(i: int) -> object:
        h = handles.setdefault(i, pynvml.nvmlDeviceGetHandleByIndex(i))
        v2 = getattr(pynvml, "nvmlMemory_v2", None)
        if v2 is not None:
            try:
                return pynvml.nvmlDeviceGetMemoryInfo(h, version=v2)
            except Exception:  # noqa: BLE001 - an old driver: fall back to v1
                pass
        return pynvml.nvmlDeviceGetMemoryInfo(h)

    return (lambda i: float(info(i).used)), (lambda i: float(info(i).total)), pynvml.nvmlShutdown


class VramSampler:
    """Samples used memory of the trial's GPUs every ``interval_s``; keeps the peak above idle.

    Use as a context manager in a trial worker. ``indices`` are NVML indices; by default
    they are the devices of this process's ``CUDA_VISIBLE_DEVICES`` (:func:`visible_nvml_indices`).
    The first reading of each GPU is its idle baseline; ``per_gpu`` holds the peak minus
    that baseline per NVML index (GiB) and ``peak_gb`` their sum; ``free_gb`` what the GPUs
    had free at that first reading (their total less the baseline), so a peak at it says the
    trial filled them (a spill into system memory, where the driver allows one). ``reader``
    (bytes used of an index) and ``capacity`` (its total bytes) replace NVML, e.g. in tests.
    Not thread-safe beyond its own sampling thread.
    """

    def __init__(self, indices: list[int] | None = None, interval_s: float = 0.05,
                 reader: Callable[[int], float] | None = None,
                 capacity: Callable[[int], float] | None = None) -> None:
        self.indices = indices
        self.interval_s = interval_s
        self.reader = reader
        self.capacity = capacity
        self.baseline: dict[int, float] = {}
        self.free: dict[int, float] = {}
        self.per_gpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shutdown: Callable[[], None] | None = None

    @property
    def peak_gb(self) -> float:
        return sum(self.per_gpu.values())

    @property
    def free_gb(self) -> float | None:
        return sum(self.free.values()) if self.free and len(self.free) == len(self.per_gpu) else None

    def metrics(self) -> dict[str, float]:
        """``vram_peak_gb``, and ``vram_free_gb`` where the GPUs' totals were read."""
        free = self.free_gb
        return {"vram_peak_gb": self.peak_gb, **({"vram_free_gb": free} if free is not None else {})}

    def sample(self) -> None:
        """One reading of every sampled GPU."""
        for i in self.indices or []:
            used = self.reader(i) / GIB
            if i not in self.baseline and self.capacity is not None:
                self.free[i] = max(0.0, self.capacity(i) / GIB - used)
            base = self.baseline.setdefault(i, used)
            self.per_gpu[i] = max(self.per_gpu.get(i, 0.0), used - base)

    def __enter__(self) -> VramSampler:
        if self.reader is None:
            nvml = _nvml_readers()
            if nvml is None:
                return self
            self.reader, self.capacity, self._shutdown = nvml
        if self.indices is None:
            self.indices = visible_nvml_indices(os.environ.get("CUDA_VISIBLE_DEVICES"), list_gpus())
        self.sample()

        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                self.sample()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.sample()
        if self._shutdown is not None:
            self._shutdown()
            self._shutdown = None


def cpu_count() -> int:
    """CPUs this process may use (affinity-aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1
