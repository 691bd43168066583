"""TrialSpec (what a worker runs) and TrialResult (what it returns): plain JSON records.

The driver builds a spec from the config and the sampler's parameters; the worker process
reads it from a file and writes a result file. Nothing else crosses the process boundary.
The workload and quality records it carries are :mod:`autotune.measure.spec`'s (re-exported
here).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from typing import Any
from typing import Literal

from autotune.measure.spec import ARRIVALS  # noqa: F401 - re-exported
from autotune.measure.spec import LOADS  # noqa: F401 - re-exported
from autotune.measure.spec import MixClass  # noqa: F401 - re-exported
from autotune.measure.spec import QualitySpec
from autotune.measure.spec import SLOSpec  # noqa: F401 - re-exported
from autotune.measure.spec import StopRule
from autotune.measure.spec import WorkloadSpec

Status = Literal["ok", "failed", "infeasible", "timeout", "stopped"]  # stopped: early (PRUNED)


@dataclass(frozen=True)
class TrialSpec:
    """Everything a trial worker needs; JSON-serialisable."""

    number: int
    engine: str
    settings: dict
    variants: dict
    params: dict
    workload: WorkloadSpec
    quality: QualitySpec
    timeout_s: float
    workdir: str
    mode: str = "trial"  # "trial" | "reference" (quality reference logits)
    early_stop: StopRule | None = None  # when to stop as soon as it cannot win (None: never)

    def __post_init__(self) -> None:
        # JSON (and older callers) give plain mappings: rebuild the typed records once, here.
        if isinstance(self.workload, dict):
            object.__setattr__(self, "workload", WorkloadSpec.from_dict(self.workload))
        if isinstance(self.quality, dict):
            object.__setattr__(self, "quality", QualitySpec.from_dict(self.quality))
        if isinstance(self.early_stop, dict):
            object.__setattr__(self, "early_stop", StopRule.from_dict(self.early_stop))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True, default=str)

    @classmethod
    def from_json(cls, text: str) -> TrialSpec:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class TrialResult:
    """What the trial worker process returns for one trial (``result.json``): ``status`` is ok,
    failed, infeasible, timeout or stopped (early, as soon as it could not win: its partial
    numbers, and a reason that starts "stopped early:"), with a reason. The driver tells it to
    Optuna, where it is kept as the trial's :class:`~autotune.search.trials.TrialAttrs`, and reads it back as a
    :class:`~autotune.search.trials.Record`.

    ``samples``: the workload's raw per-request samples (``Engine.measure``'s second value:
    ``decode_tps``, ``ttft_ms``, ``prompt_tokens``, ``output_tokens``, an SLO search's
    ``search`` levels), pooled by the re-measurement and read by the roofline; ``info``: what
    the engine says of itself (its ``info``, the energy counters' description).
    """

    number: int
    status: Status
    metrics: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    samples: dict[str, Any] = field(default_factory=dict)
    log_tail: str = ""
    duration_s: float = 0.0  # the whole trial, process start to exit (set by the runner)
    node: str = ""
    times_s: dict[str, float] = field(default_factory=dict)  # phases: load, workload, quality

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True, default=str)

    @classmethod
    def from_json(cls, text: str) -> TrialResult:
        data = json.loads(text)
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def replace(self, **kw: Any) -> TrialResult:
        data = asdict(self)
        data.update(kw)
        return TrialResult(**data)
