"""The roofline share of a trial: its decode speed over the box's memory-bandwidth limit.

At launch the driver keeps the engine's prediction of what a decoded token reads on each
device (``Prediction.reads``, :class:`~autotune.engines.roofline.DeviceRead`). When the
trial's result comes back, :func:`with_roofline` adds to its metrics:

- ``read_mb_per_token``: MiB one decode step reads (active weights + every stream's KV at
  the workload's context: the median over requests of prompt + half the output tokens);
- ``roofline_tps``: the per-stream bound, read bandwidth / those bytes;
- ``roofline_pct``: 100 * ``decode_tps`` / ``roofline_tps``.

Streams decoded together share one read of the weights: a closed-loop workload counts
``concurrency`` streams (the SLO search's ``max_concurrency_at_slo``). :func:`why_unknown`
says why a trial has no roofline share.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from autotune.engines.predict import Prediction
from autotune.engines.roofline import DeviceRead
from autotune.engines.roofline import roofline
from autotune.errors import ConfigError
from autotune.measure.spec import WorkloadSpec
from autotune.record.summary import Headroom
from autotune.registry import get_engine_class
from autotune.search.trials import Record
from autotune.trial.spec import TrialResult

MIB = float(1 << 20)


def context_tokens(samples: dict) -> float | None:
    """Median over requests of the context a decoded token sees on average (prompt + half
    the output), from a result's raw samples; None without them."""
    prompts, outputs = samples.get("prompt_tokens") or [], samples.get("output_tokens") or []
    if not prompts or len(prompts) != len(outputs):
        return None
    return float(statistics.median(p + o / 2 for p, o in zip(prompts, outputs)))


def streams(metrics: dict[str, float], wl: WorkloadSpec) -> int:
    """Streams decoding together: the closed-loop level measured (1 for an open loop)."""
    if wl.arrival != "closed":
        return 1
    level = metrics.get("max_concurrency_at_slo") if wl.load == "slo" else wl.concurrency
    return max(1, int(level or wl.concurrency))


def roofline_metrics(reads: list[DeviceRead], metrics: dict[str, float], samples: dict,
                     wl: WorkloadSpec) -> dict[str, float]:
    """``read_mb_per_token``, ``roofline_tps`` and ``roofline_pct`` of a measured trial
    ({} when the reads, the context, a bandwidth or ``decode_tps`` is missing)."""
    ctx = context_tokens(samples)
    if not reads or ctx is None:
        return {}
    bound = roofline(reads, ctx, streams(metrics, wl))
    if bound is None:
        return {}
    out = {"read_mb_per_token": bound.bytes_per_step / MIB, "roofline_tps": bound.limit_tps}
    tps = metrics.get("decode_tps")
    if tps is not None and math.isfinite(tps):
        out["roofline_pct"] = 100.0 * tps / bound.limit_tps
    return out


def with_roofline(result: TrialResult, reads: list[dict], wl: WorkloadSpec) -> TrialResult:
    """``result`` with the roofline metrics added (unchanged unless it ran and they are known)."""
    if not result.ok or not reads:
        return result
    extra = roofline_metrics([DeviceRead.from_dict(r) for r in reads], result.metrics,
                             result.samples, wl)
    return result.replace(metrics={**result.metrics, **extra}) if extra else result


def bandwidth_text(reads: Sequence[DeviceRead]) -> str:
    """The devices read and their bandwidths: ``RAM 21.3 GB/s (read probe)``."""
    parts = []
    for r in reads:
        if r.weights_bytes > 0 or r.kv_bytes_per_ctx > 0:
            bw = f"{r.bandwidth_gbps:.1f} GB/s" if r.bandwidth_gbps else "unknown bandwidth"
            parts.append(f"{r.label} {bw}" + (f" ({r.source})" if r.source else ""))
    return ", ".join(parts)


def why_unknown(engine: str, prediction: Prediction | None, metrics: dict[str, float]) -> str:
    """One line: why a trial's metrics hold no ``roofline_pct`` ("" when they do)."""
    if "roofline_pct" in metrics:
        return ""
    reads = prediction.reads if prediction else ()
    if not reads:
        try:
            how = get_engine_class(engine).no_reads_hint
        except ConfigError:  # a study recorded by an engine this install no longer has
            how = ""
        return (f"roofline share unknown: the {engine} engine's prediction does not say how many "
                f"bytes a decoded token reads{how}")
    missing = [r.label for r in reads if not r.bandwidth_gbps]
    if missing:
        return (f"roofline share unknown: no bandwidth for {', '.join(missing)} (set "
                "engine.settings.gpus[i].bandwidth_gbps or memory_bandwidth_gbps)")
    if "decode_tps" not in metrics:
        return "roofline share unknown: the trial measured no decode_tps"
    return "roofline share unknown: the trial kept no per-request token counts"


def winner_headroom(engine: str, winner: Record | None, prediction: Prediction | None,
                    energy_note: str = "") -> Headroom | None:
    """The winner's :class:`Headroom` (its share of the re-measured decode_tps where re-measured:
    :func:`autotune.run.remeasure._merge` updates ``roofline_pct``)."""
    if winner is None:
        return None
    m = winner.metrics
    energy = m.get("energy_j_per_token")
    if "roofline_tps" not in m or "decode_tps" not in m:
        return Headroom(note=why_unknown(engine, prediction, m), energy_j_per_token=energy,
                        energy_note=energy_note)
    return Headroom(round(m.get("roofline_pct", 100.0 * m["decode_tps"] / m["roofline_tps"]), 1),
                    round(m["roofline_tps"], 2),
                    round(m["read_mb_per_token"], 2), bandwidth_text(prediction.reads if prediction else ()),
                    energy_j_per_token=energy, energy_note=energy_note)


def energy_note(workdir: Path) -> str:
    """What a trial's ``result.json`` says of its energy counters (or why it had none)."""
    try:
        return str((json.loads((Path(workdir) / "result.json").read_text()).get("info") or {})
                   .get("energy") or "")
    except (OSError, ValueError):
        return ""
