"""What a study asks of its metrics: an :class:`Objective` (a metric and its direction) and a
:class:`Constraint` (``metric op bound``).

They sit here, at the bottom stage beside the metrics they name, because the config that parses
them, the search that samples against them and the record that tells them all read them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Objective:
    """A metric to optimise, ``maximize`` or ``minimize``."""

    metric: str
    direction: str


@dataclass(frozen=True)
class Constraint:
    """``metric op bound``; Optuna's convention: value <= 0 is feasible."""

    metric: str
    op: str
    bound: float

    def violation(self, value: float) -> float:
        """Signed violation in the metric's unit (<= 0 is feasible)."""
        return value - self.bound if self.op == "<=" else self.bound - value

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.bound:g}"
