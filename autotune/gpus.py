"""GPU inventory via NVML (nvidia-ml-py): names and memory, and peak-usage sampling.

Works on machines without a GPU: :func:`list_gpus` returns ``[]`` when NVML is absent.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    memory_gb: float


def list_gpus() -> list[GPU]:
    """Visible GPUs with their total memory; [] without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound and friends
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            out.append(GPU(i, name, pynvml.nvmlDeviceGetMemoryInfo(h).total / 1e9))
        return out
    finally:
        pynvml.nvmlShutdown()


class VramSampler:
    """Samples used memory of the given GPU indices every ``interval_s``; keeps the peak.

    Use as a context manager in a trial worker; ``peak_gb`` is the summed peak of the
    per-GPU maxima (GB) and ``per_gpu`` the maxima per index.
    """

    def __init__(self, indices: list[int] | None = None, interval_s: float = 0.05) -> None:
        self.indices = indices
        self.interval_s = interval_s
        self.per_gpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def peak_gb(self) -> float:
        return sum(self.per_gpu.values())

    def __enter__(self) -> VramSampler:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # noqa: BLE001
            return self
        n = pynvml.nvmlDeviceGetCount()
        handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in (self.indices or range(n))}

        def loop() -> None:
            while not self._stop.is_set():
                for i, h in handles.items():
                    used = pynvml.nvmlDeviceGetMemoryInfo(h).used / 1e9
                    self.per_gpu[i] = max(self.per_gpu.get(i, 0.0), used)
                self._stop.wait(self.interval_s)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
