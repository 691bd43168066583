"""The trial :class:`Record`: a finished trial as the selector, exporter and reports see it.

Built from the Optuna storage by :func:`autotune.record.study.records` (and returned by
:func:`autotune.record.study.tell`), carried inside a
:class:`~autotune.record.summary.StudySummary` as its baseline and winner, and ranked by
:mod:`autotune.search.select`. Frozen: a record is what was measured, never edited.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import Any


@dataclass(frozen=True)
class Record:
    """A finished trial as the exporter and selector see it."""

    number: int
    params: dict[str, Any]
    metrics: dict[str, float]
    status: str = "ok"
    feasible: bool = True
    reason: str = ""
    violations: dict[str, float] = field(default_factory=dict)
    kind: str = "launched"  # launched (ran), rejected (never started), duplicate (reused a result)
