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

    def broken(self) -> str:
        """Which constraints it broke, with the value measured: ``broke ttft_p95_ms <= 2000
        (measured 2315)``; empty when it broke none."""
        return broken_text(self.violations, self.metrics)


def broken_text(violations: dict[str, float], metrics: dict[str, float]) -> str:
    """``broke <constraint> (measured <value>); ...`` for each positive violation, else empty."""
    out = []
    for name, violation in violations.items():
        if violation > 0:
            value = metrics.get(str(name).split()[0])
            out.append(f"{name}" + (f" (measured {value:.4g})" if isinstance(value, (int, float)) else ""))
    return ("broke " + "; ".join(out)) if out else ""
