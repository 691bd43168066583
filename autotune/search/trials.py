"""A finished trial as the search reads it: :class:`Record` and :class:`TrialAttrs`.

Three shapes of one trial cross the stages, each at its own boundary:

- :class:`autotune.trial.spec.TrialResult`: what the worker process returns (JSON), below;
- :class:`TrialAttrs`: what autotune keeps in the trial's Optuna user attributes, read back by
  :func:`trial_attrs` (the sampler reads it to tell launched trials from reused ones);
- :class:`Record`: a finished trial as the selector, exporter and reports see it: built from the
  storage by :func:`autotune.record.optuna_study.records` (and returned by
  :func:`autotune.record.optuna_study.tell`), ranked by :mod:`autotune.search.select`, carried in a
  :class:`~autotune.record.summary.StudySummary` as its baseline and winner.

They live here, below the record stage that writes them, because the search reads them.
Frozen: a record is what was measured, never edited.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any

from autotune.engines.predict import Prediction

if TYPE_CHECKING:
    import optuna

LAUNCHED, REJECTED, DUPLICATE, INTERRUPTED = "launched", "rejected", "duplicate", "interrupted"


@dataclass(frozen=True)
class Record:
    """A finished trial as the selector, exporter and reports see it: read back from the Optuna
    storage (the trial's :class:`TrialAttrs` and its told constraints), feasibility decided.

    Not :class:`~autotune.trial.spec.TrialResult` (what the worker process returned, with its
    raw samples and engine info) nor :class:`TrialAttrs` (what is kept in the storage).
    """

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


@dataclass(frozen=True)
class TrialAttrs:
    """What autotune keeps in a trial's Optuna user attributes (None or empty when absent).

    ``status``/``reason``/``metrics``/``node``/``duration_s``/``times_s``: the trial's result
    (``times_s``: its phases, load, workload and quality, in s);
    ``params``: its decoded parameters; ``kind``: launched, rejected, duplicate or
    interrupted; ``prediction``: the engine's pre-launch estimate (``need_gb``,
    ``have_gb``, ``decode_tps_upper``, ``reads``; stored as a mapping); ``role`` (baseline, enqueued, design, rerun),
    ``rerun_of`` and ``duplicate_of``: where the trial came from.
    """

    status: str | None = None
    reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, Any] | None = None
    kind: str | None = None
    node: str = ""
    duration_s: float = 0.0
    times_s: dict[str, float] = field(default_factory=dict)  # phases: load, workload, quality
    prediction: Prediction | None = None
    role: str | None = None
    rerun_of: int | None = None
    duplicate_of: int | None = None
    quality_from: int | None = None  # the trial whose quality numbers it reused (quality.reuse)


def trial_attrs(t: optuna.trial.FrozenTrial) -> TrialAttrs:
    """A finished (or running) trial's user attributes as a :class:`TrialAttrs`."""
    u = t.user_attrs
    return TrialAttrs(status=u.get("status"), reason=u.get("reason", ""), metrics=u.get("metrics", {}),
                      params=u.get("params"), kind=u.get("kind"), node=str(u.get("node", "")),
                      duration_s=float(u.get("duration_s") or 0.0), times_s=u.get("times_s") or {},
                      prediction=Prediction.from_stored(u.get("prediction")),
                      role=u.get("role"), rerun_of=u.get("rerun_of"), duplicate_of=u.get("duplicate_of"),
                      quality_from=u.get("quality_from"))
