"""TrialSpec (what a worker runs) and TrialResult (what it returns): plain JSON records.

The driver builds a spec from the config and the sampler's parameters; the worker process
reads it from a file and writes a result file. Nothing else crosses the process boundary.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Literal

Status = Literal["ok", "failed", "infeasible", "timeout"]


@dataclass(frozen=True)
class TrialSpec:
    """Everything a trial worker needs; JSON-serialisable."""

    number: int
    engine: str
    settings: dict
    variants: dict
    params: dict
    workload: dict
    quality: dict
    timeout_s: float
    workdir: str
    mode: str = "trial"  # "trial" | "reference" (quality reference logits)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True, default=str)

    @classmethod
    def from_json(cls, text: str) -> TrialSpec:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class TrialResult:
    """A finished trial. ``status`` is ok, failed, infeasible or timeout, with a reason."""

    number: int
    status: Status
    metrics: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    log_tail: str = ""
    duration_s: float = 0.0
    node: str = ""

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


def write_atomic(path: str | Path, text: str) -> None:
    """Write a file so readers never see it half-written (temp file + os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
