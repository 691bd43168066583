"""GPU memory of a server engine's trial, sampled by NVML from before the server starts.

A mixin for :class:`autotune.engines.openai_server.OpenAIServerEngine` subclasses whose
server loads onto GPUs (``tabbyapi``, ``llama_server``): ``start`` makes CUDA number devices
as NVML does and starts a :class:`autotune.hardware.VramSampler` before the server (which
loads before ``/health`` answers); ``memory`` adds ``vram_peak_gb`` (the trial's GPUs' peak
above idle) and ``info.vram_per_gpu_gb``; ``stop`` ends the sampling. Without NVML (a CPU
box) nothing is sampled and no ``vram_peak_gb`` is reported.
"""

from __future__ import annotations

import os

from autotune.hardware import VramSampler
from autotune.hardware import pci_bus_order_env


class GpuSampled:
    """Mixin: put it before the server engine class in the bases."""

    def start(self) -> None:
        os.environ.update(pci_bus_order_env())  # the server numbers GPUs as NVML does
        self.vram = VramSampler().__enter__()
        super().start()

    def memory(self) -> dict[str, float]:
        """The server's memory (peak RSS), and the GPUs' peak use above idle (with NVML)."""
        out = super().memory()
        vram = getattr(self, "vram", None)
        if vram is not None and vram.per_gpu:
            self.info.update(vram_per_gpu_gb=dict(vram.per_gpu), vram_free_per_gpu_gb=dict(vram.free))
            out.update(vram.metrics())
        return out

    def stop(self) -> None:
        super().stop()
        if getattr(self, "vram", None) is not None:
            self.vram.__exit__(None, None, None)
            self.vram = None
