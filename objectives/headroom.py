"""Headroom metrics: how close a trial decodes to the memory-bandwidth limit, and its energy.

Each is declared once with its unit and direction; docs/metrics.md defines them, their
sources and their limits. The roofline metrics are computed by the driver from the
engine's pre-launch prediction of the bytes a token reads (:mod:`autotune.run.headroom`);
``energy_j_per_token`` by the trial worker from NVML's or RAPL's energy counter
(:mod:`autotune.measure.energy`). Either is absent where its source is.
"""

from __future__ import annotations

from autotune.objectives._registry import register_metric

register_metric("roofline_pct", "%", "maximize",
                "decode_tps / the memory-bandwidth bound (read bandwidth / bytes read per "
                "decoded token at the workload's context), in %")
register_metric("roofline_tps", "tok/s", "maximize",
                "the memory-bandwidth bound of one stream's decode at the workload's context")
register_metric("read_mb_per_token", "MB", "minimize",
                "MiB one decode step reads: active weights + every stream's KV at the context")
register_metric("energy_j_per_token", "J/tok", "minimize",
                "energy above idle over the measurement / output tokens (NVML per GPU of the "
                "trial, whole device; else RAPL package counters on CPU)")
