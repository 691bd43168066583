"""Per-GPU peak memory of a server engine's trial (NVML), for engines whose server owns the GPUs.

:class:`SamplesVram` goes before the server engine in the bases: ``start_vram`` starts the
sampler (before the load, which happens before ``/health`` answers), :meth:`memory` adds
``vram_peak_gb`` and ``info["vram_per_gpu_gb"]`` (what the spill check reads), :meth:`stop`
ends the sampler after the server.
"""

from __future__ import annotations

from autotune.hardware import VramSampler


class SamplesVram:
    """A mixin for :class:`~autotune.engines.openai_server.OpenAIServerEngine` subclasses."""

    vram: VramSampler | None = None

    def start_vram(self) -> None:
        self.vram = VramSampler().__enter__()

    def memory(self) -> dict[str, float]:
        """Peak RSS of the server's processes, and the GPUs' peak use above idle (with NVML)."""
        out = super().memory()
        if self.vram is not None and self.vram.per_gpu:
            self.info["vram_per_gpu_gb"] = dict(self.vram.per_gpu)
            out["vram_peak_gb"] = self.vram.peak_gb
        return out

    def stop(self) -> None:
        super().stop()
        if self.vram is not None:
            self.vram.__exit__(None, None, None)
            self.vram = None
