"""Spill is a failure: a trial whose card sat at its limit while its decode fell far below the
predicted bound ran out of VRAM into system memory, and is recorded infeasible.

A driver that falls back to system memory when a card is full (NVIDIA's "sysmem fallback"
on Windows, unified memory) turns an OOM into a run several times slower instead of an error;
a tuner that does not look crowns it. :func:`spill_reason` is the rule, :func:`trial_spill`
applies it to a finished trial's measurements and :func:`judge` to its result (the driver
calls it on every result before the sampler is told).
"""

from __future__ import annotations

import math

from autotune.engines.predict import gpu_table

SPILL_FULL = 0.93  # a card this full of its capacity sits at its limit
SPILL_SLOW = 0.25  # a decode below this share of the predicted bound is far too slow for a fit


def spill_reason(vram_gb: list[float], capacity_gb: list[float], decode_tps: float | None,
                 decode_upper: float | None) -> str | None:
    """Why a trial spilled into system memory, or None (not judged without a bound).

    ``vram_gb`` and ``capacity_gb`` are per GPU, in the same order: a card at
    ``SPILL_FULL`` of its capacity together with a decode below ``SPILL_SLOW`` of the
    predicted bound is a spill.
    """
    if not decode_upper or decode_tps is None or not math.isfinite(decode_tps):
        return None
    if decode_tps >= SPILL_SLOW * decode_upper:
        return None
    for i, (used, cap) in enumerate(zip(vram_gb, capacity_gb)):
        if cap and used >= SPILL_FULL * cap:
            share = decode_tps / decode_upper
            return (f"spilled into system memory: GPU {i} at {used:.1f} of {cap:.1f} GB "
                    f"while decode ran {decode_tps:.1f} tok/s, {share:.0%} of the "
                    f"predicted {decode_upper:.1f}")
    return None


def trial_spill(info: dict, metrics: dict, settings, decode_upper: float | None) -> str | None:
    """:func:`spill_reason` of a measured trial: its per-GPU peak above idle
    (``info.vram_per_gpu_gb``, by NVML index) against the cards of ``engine.settings.gpus``
    (else NVML's), each no more than what it had free when the trial started
    (``info.vram_free_per_gpu_gb``: other processes' memory is not the trial's to fill)."""
    per_gpu = (info or {}).get("vram_per_gpu_gb") or {}
    if not per_gpu:
        return None
    free = (info or {}).get("vram_free_per_gpu_gb") or {}
    keys = sorted(per_gpu, key=int)
    caps = [float(g.get("memory_gb") or 0) for g in gpu_table(settings)]
    caps = [min(c, float(free[k])) if c and free.get(k) else c for c, k in zip(caps, keys)]
    used = [float(per_gpu[k]) for k in keys]
    return spill_reason(used, caps, (metrics or {}).get("decode_tps"), decode_upper)


def judge(result, settings, decode_upper: float | None):
    """A measured :class:`~autotune.trial.spec.TrialResult` that spilled becomes infeasible
    with the reason; any other result is returned as it is."""
    if result.status != "ok":
        return result
    why = trial_spill(result.info, result.metrics, settings, decode_upper)
    return result.replace(status="infeasible", reason=why) if why else result
