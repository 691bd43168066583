"""What a trial measures: the workload (:class:`WorkloadSpec`) and the quality evaluation
(:class:`QualitySpec`), as frozen records.

:mod:`autotune.measure` consumes them; the ``workload:`` and ``quality:`` config sections
are these records, and :class:`autotune.trial.spec.TrialSpec` carries them across the
process boundary as JSON (``to_dict`` / ``from_dict``).
"""

from __future__ import annotations

from dataclasses import asdict
from dataclasses import dataclass
from typing import Any

ARRIVALS = ("closed", "poisson")
LOADS = ("fixed", "slo")


@dataclass(frozen=True)
class SLOSpec:
    """Service-level objective of the load search; a bound of None is not checked.

    A load level meets the SLO when every bound holds over its requests: TTFT p95, ITL p95
    and e2e p99 in ms, and the share of failed requests (0-1) at most ``error_rate``.
    """

    ttft_p95_ms: float | None = None
    itl_p95_ms: float | None = None
    e2e_p99_ms: float | None = None
    error_rate: float = 0.0


@dataclass(frozen=True)
class MixClass:
    """One class of a mixed workload: prompt and output lengths (tokens) and a weight."""

    prompt_tokens: int
    output_tokens: int
    weight: float = 1.0


@dataclass(frozen=True)
class WorkloadSpec:
    """What a trial runs; the ``workload:`` config section is exactly this record.

    Single-turn prompts from ``prompts`` by default; ``turns > 1`` runs conversations that
    resend the growing history; ``mix`` draws (prompt, output) lengths per request from
    ``seed``; ``context_ladder`` runs long prompts of those lengths up to the trial's
    context. ``arrival`` is ``closed`` (``concurrency`` users, each one request in
    flight) or ``poisson`` (open loop at ``rate`` requests/s). ``load: slo`` searches,
    within the trial, the highest concurrency (or rate) meeting ``slo``, from 1 up to
    ``max_concurrency`` (or ``rate`` up to ``max_rate``), in at most ``search_time_s``.
    """

    name: str = "short"
    prompts: str = "short"
    max_tokens: int = 64
    warmup: int = 1
    repeats: int = 5
    concurrency: int = 1
    ignore_eos: bool = True
    arrival: str = "closed"
    rate: float | None = None
    turns: int = 1
    mix: tuple[MixClass, ...] = ()
    seed: int = 0
    context_ladder: tuple[int, ...] = ()
    load: str = "fixed"
    slo: SLOSpec = SLOSpec()
    max_concurrency: int = 16
    max_rate: float = 64.0
    search_time_s: float = 180.0
    saturation_gain: float = 0.05

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One line for reports: the shape, the output length and the load it is measured at."""
        if self.turns > 1:
            shape = f"{self.turns}-turn conversations of '{self.prompts}' prompts, {self.max_tokens} new tokens each"
        elif self.mix:
            classes = ", ".join(f"{m.prompt_tokens}/{m.output_tokens}" for m in self.mix)
            shape = f"mixed prompt/output tokens {classes} (seed {self.seed})"
        elif self.context_ladder:
            shape = (f"context ladder {', '.join(map(str, self.context_ladder))} prompt tokens "
                     f"(up to the trial's context), {self.max_tokens} new tokens")
        else:
            shape = f"'{self.prompts}' prompts, {self.max_tokens} new tokens"
        unit = "req/s" if self.arrival == "poisson" else "users"
        if self.load == "slo":
            bounds = [f"{k} <= {getattr(self.slo, k):g}" for k in ("ttft_p95_ms", "itl_p95_ms", "e2e_p99_ms")
                      if getattr(self.slo, k) is not None] + [f"error_rate <= {self.slo.error_rate:g}"]
            top = self.max_rate if self.arrival == "poisson" else self.max_concurrency
            start = self.rate if self.arrival == "poisson" else self.concurrency
            load = (f"the most load ({start:g} to {top:g} {unit}, {self.search_time_s:g} s) meeting "
                    f"{', '.join(bounds)}; latency metrics are those at that load")
        elif self.arrival == "poisson":
            load = f"Poisson arrivals at {self.rate:g} req/s (latency constraints hold at this load)"
        else:
            load = (f"{self.warmup} warm-up + {self.repeats} measured rounds at concurrency "
                    f"{self.concurrency} (latency constraints hold at this load)")
        return f"workload {self.name}: {shape}; {load}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkloadSpec:
        """Rebuild from JSON (lists back to tuples, nested records back to dataclasses)."""
        d = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if isinstance(d.get("slo"), dict):
            d["slo"] = SLOSpec(**d["slo"])
        if "mix" in d:
            d["mix"] = tuple(m if isinstance(m, MixClass) else MixClass(**m) for m in d["mix"] or ())
        if "context_ladder" in d:
            d["context_ladder"] = tuple(int(x) for x in d["context_ladder"] or ())
        return cls(**d)


@dataclass(frozen=True)
class StopRule:
    """When a trial stops early (:mod:`autotune.measure.early_stop`), as the driver sends it.

    ``objective``: the metric the winner is chosen by (None: no objective check), better when
    higher if ``maximize``; ``incumbent``: the best feasible value measured so far (None: none
    yet), by trial ``incumbent_trial``; ``bounds``: the constraints as ``[metric, op, bound]``
    with ``op`` ``<=`` or ``>=``.
    """

    objective: str | None = None
    maximize: bool = True
    incumbent: float | None = None
    incumbent_trial: int | None = None
    bounds: tuple[tuple[str, str, float], ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StopRule:
        d = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        d["bounds"] = tuple((str(m), str(op), float(b)) for m, op, b in d.get("bounds") or ())
        return cls(**d)


@dataclass(frozen=True)
class QualitySpec:
    """What a trial's quality evaluation needs: the text, its length and the reference."""

    enabled: bool = True
    text: str = "gpl3"
    n_tokens: int = 512
    kld: bool = True
    reference_dir: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QualitySpec:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
