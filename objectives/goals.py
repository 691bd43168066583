"""What a study asks of its metrics: an :class:`Objective` (a metric and its direction) and a
:class:`Constraint` (``metric op bound``, or ``metric op F x baseline``).

They sit here, at the bottom stage beside the metrics they name, because the config that parses
them, the search that samples against them and the record that tells them all read them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Objective:
    """A metric to optimise, ``maximize`` or ``minimize``."""

    metric: str
    direction: str


@dataclass(frozen=True)
class Constraint:
    """``metric op bound``; Optuna's convention: value <= 0 is feasible.

    A relative constraint (``ttft_p95_ms <= 1.5x baseline``) has a ``factor`` and its bound is
    that factor times the baseline's measured value: NaN until the driver measured it
    (:meth:`resolved`), so a box's own speed sets the bound. Its name (``str``) is the same
    before and after, the key under which each trial's violation is stored.
    """

    metric: str
    op: str
    bound: float
    factor: float | None = None  # a relative constraint: bound = factor x the baseline's value

    @property
    def known(self) -> bool:
        """Whether the bound is a number (an absolute constraint, or a resolved relative one)."""
        return math.isfinite(self.bound)

    def resolved(self, baseline: float) -> Constraint:
        """This relative constraint with its bound set from the baseline's value."""
        return dataclasses.replace(self, bound=self.factor * baseline)

    def violation(self, value: float) -> float:
        """Signed violation in the metric's unit (<= 0 is feasible)."""
        return value - self.bound if self.op == "<=" else self.bound - value

    def describe(self) -> str:
        """For people: ``ttft_p95_ms <= 1.5x baseline (= 686)`` once the bound is known."""
        if self.factor is None or not self.known:
            return str(self)
        return f"{self} (= {self.bound:.4g})"

    def __str__(self) -> str:
        if self.factor is not None:
            return f"{self.metric} {self.op} {self.factor:g}x baseline"
        return f"{self.metric} {self.op} {self.bound:g}"
