"""The memory-bandwidth roofline of decoding: what a token reads, and how fast the box reads.

Decoding one token reads every (active) weight once and the KV cache of the context so far,
so no engine decodes faster than ``bandwidth / bytes read per token``. An engine's
``predict`` (:mod:`autotune.engines.predict`) returns, per device, a :class:`DeviceRead`:
the weight bytes a token reads there (the active experts only for a mixture-of-experts
model whose GGUF says how many are used), the KV bytes per token of context, and the
device's read bandwidth with where it came from. :func:`roofline` turns those and the
workload's context into the bound; :mod:`autotune.run.headroom` divides the measured decode
speed by it (the roofline share).

The CPU's bandwidth is a *read* probe (:func:`probe_ram_read_gbps`: a multi-threaded
OR-reduction over a buffer larger than the caches), since decoding reads weights and writes almost
nothing; a GPU's is the spec sheet's (``GPU_BANDWIDTH_GBPS`` in predict.py) unless
``engine.settings.gpus[i].bandwidth_gbps`` gives a measured one. GB/s are 1e9 bytes/s.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from autotune.hardware import cpu_count

READ_PROBE = "numpy OR-reduce of 512 MiB on every CPU and on one, best of 5 each"


@dataclass(frozen=True)
class DeviceRead:
    """What one decoded token reads on one device, and how fast that device reads.

    ``weights_bytes``: weight bytes read per token there (active experts only for MoE);
    ``kv_bytes_per_ctx``: KV-cache bytes read per token of context (keys and values of every
    layer on the device); ``bandwidth_gbps``: read bandwidth (1e9 B/s), None when unknown;
    ``source``: where the bandwidth comes from ("read probe", "spec sheet", "settings").
    """

    label: str
    weights_bytes: float
    kv_bytes_per_ctx: float
    bandwidth_gbps: float | None
    source: str = ""

    def to_dict(self) -> dict:
        return {"label": self.label, "weights_bytes": self.weights_bytes,
                "kv_bytes_per_ctx": self.kv_bytes_per_ctx, "bandwidth_gbps": self.bandwidth_gbps,
                "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> DeviceRead:
        return cls(str(d["label"]), float(d["weights_bytes"]), float(d["kv_bytes_per_ctx"]),
                   None if d.get("bandwidth_gbps") is None else float(d["bandwidth_gbps"]),
                   str(d.get("source", "")))


@dataclass(frozen=True)
class Roofline:
    """The bound at a context: bytes one decode step reads and the tokens/s per stream it allows."""

    bytes_per_step: float
    limit_tps: float
    bandwidth: str  # "RAM 21.3 GB/s (read probe)"


def roofline(reads: list[DeviceRead], context_tokens: float, streams: int = 1) -> Roofline | None:
    """The decode bound per stream when ``streams`` sequences decode together at
    ``context_tokens`` each: one step reads the weights once and every stream's KV, device
    after device. None when a device that holds bytes has no known bandwidth."""
    seconds, total, parts = 0.0, 0.0, []
    streams = max(1, int(streams))
    for r in reads:
        nbytes = r.weights_bytes + streams * r.kv_bytes_per_ctx * max(0.0, context_tokens)
        if nbytes <= 0:
            continue
        if not r.bandwidth_gbps:
            return None
        seconds += nbytes / (r.bandwidth_gbps * 1e9)
        total += nbytes
        parts.append(f"{r.label} {r.bandwidth_gbps:.1f} GB/s" + (f" ({r.source})" if r.source else ""))
    if seconds <= 0:
        return None
    return Roofline(total, 1.0 / seconds, ", ".join(parts))


def _or_reduce(part) -> int:
    import numpy as np

    return int(np.bitwise_or.reduce(part))


def probe_ram_read_gbps(size_mb: int = 512, repeats: int = 5) -> float:
    """RAM read bandwidth (GB/s, 1e9): the best of ``repeats`` passes over a buffer far larger
    than the caches, each CPU OR-reducing its slice (numpy releases the GIL in the reduction),
    and of as many passes on one thread (on a busy box one thread may read faster than two).

    An OR-reduction of uint64 is the cheapest numpy pass that touches every byte: ``np.sum``
    of float64 is bound by its additions on this kind of CPU (10-12 GB/s where OR reads 18-25,
    measured side by side on the 2-core box of bench/results; noisy, shared).
    """
    import numpy as np

    buf = np.ones(size_mb * (1 << 20) // 8, dtype=np.uint64)
    best = math.inf
    for threads in sorted({1, max(1, cpu_count())}, reverse=True):
        parts = [p for p in np.array_split(buf, threads) if p.size]
        with ThreadPoolExecutor(len(parts)) as pool:
            list(pool.map(_or_reduce, parts))  # first touch outside the timing
            for _ in range(repeats):
                t = time.perf_counter()
                list(pool.map(_or_reduce, parts))
                best = min(best, time.perf_counter() - t)
    return buf.nbytes / best / 1e9
