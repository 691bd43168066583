"""Typed end-of-study records: the winner's :class:`Verdict` and the :class:`StudySummary`.

Both are frozen dataclasses; ``summary.json`` stays their on-disk form (``to_dict`` /
``from_dict`` round-trip, optional verdict keys are left out when unknown, as before).
:meth:`StudySummary.load` reads ``summary.json`` back and :meth:`StudySummary.to_json` writes
it: for a summary written by autotune the two give back the file's bytes. Code outside
``autotune/record/`` reads these records by attribute, never by string key.
:func:`prediction_error` compares what the engine predicted before each launch (memory
needed, decode speed upper bound) with what the trial then measured.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from autotune.engines.predict import Prediction
from autotune.engines.predict import compare
from autotune.errors import ConfigError
from autotune.registry import get_engine_class
from autotune.search.trials import Record

# keys of summary.json written only when known (older summaries lack them too)
_OPTIONAL = ("remeasured", "lead_within_noise", "runner_up", "speedup", "speedup_source",
             "speedup_within_noise", "note", "stop_reason", "prediction", "headroom",
             "overhead_s")


def _record(data: dict | None) -> Record | None:
    if data is None:
        return None
    names = {f.name for f in dataclasses.fields(Record)}
    return Record(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Remeasurement:
    """What the side-by-side re-measurement says: medians, the speed-up and how sure it is.

    Shared by :class:`Verdict` (what ``choose_winner`` returns) and :class:`StudySummary`
    (where the driver copies it, under the same keys of ``summary.json``).
    """

    remeasured: Remeasured | None = None  # summary.json: {"metric", "by_trial": {n: row}}
    lead_within_noise: bool | None = None
    runner_up: int | None = None
    speedup: float | None = None
    speedup_source: str | None = None
    speedup_within_noise: bool | None = None
    note: str | None = None

    def remeasured_rows(self) -> list[RemeasuredRow]:
        """The side-by-side re-measurement, one row per trial, in the order it was stored."""
        return list(self.remeasured.rows) if self.remeasured else []

    def noise_words(self, within: bool | None, *trials: int | None) -> str | None:
        """How a noise verdict on ``trials`` reads: "within noise", "outside noise", or, when a
        side has fewer than two re-measured samples (its bootstrap has no spread, so
        :func:`~autotune.measure.stats.within_noise` cannot establish a lead), "not judged"."""
        if within is None:
            return None
        rows = [self.remeasured.row(t) for t in trials if t is not None] if self.remeasured else []
        few = min((r.n for r in rows if r is not None), default=None)
        if within and few is not None and few < 2:
            return (f"not judged: {few} re-measured sample{'s' if few != 1 else ''} on a side; "
                    "raise select.rerun_repeats")
        return "within noise" if within else "outside noise"

    @property
    def remeasured_metric(self) -> str | None:
        """The metric the re-measurement compared (None if there was none)."""
        return self.remeasured.metric if self.remeasured else None


@dataclass(frozen=True)
class RemeasuredRow:
    """One trial's re-measured median, its 95% confidence interval, the sample count and, when
    its re-measured numbers broke a constraint (or its re-runs failed), why it was dropped."""

    trial: str  # the trial number as summary.json keys it
    median: float
    ci95: tuple[float, float]
    n: int
    dropped: str = ""  # e.g. "broke ttft_p95_ms <= 200 (measured 203.1)"; empty: it stayed a candidate

    def to_dict(self) -> dict[str, Any]:
        """The row as ``summary.json`` holds it under its trial: ``{median, ci95, n[, dropped]}``."""
        out: dict[str, Any] = {"median": self.median, "ci95": list(self.ci95), "n": self.n}
        if self.dropped:
            out["dropped"] = self.dropped
        return out

    @classmethod
    def from_dict(cls, trial: int | str, data: dict[str, Any]) -> RemeasuredRow:
        return cls(str(trial), data["median"], tuple(data["ci95"]), data["n"], data.get("dropped", ""))


@dataclass(frozen=True)
class Remeasured:
    """The side-by-side re-measurement of one metric: a row per re-measured trial, in the order
    ``choose_winner`` measured them (the order ``summary.json`` keeps)."""

    metric: str
    rows: tuple[RemeasuredRow, ...] = ()

    def row(self, trial: int | str) -> RemeasuredRow | None:
        """The row of trial ``trial`` (None if it was not re-measured)."""
        return next((r for r in self.rows if r.trial == str(trial)), None)

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "by_trial": {r.trial: r.to_dict() for r in self.rows}}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Remeasured | None:
        if data is None:
            return None
        return cls(data["metric"], tuple(RemeasuredRow.from_dict(n, v) for n, v in data["by_trial"].items()))


@dataclass(frozen=True)
class Verdict(Remeasurement):
    """The winner chosen on re-measured numbers, and how sure that choice is."""

    winner: Record | None = None
    baseline_remeasured: Record | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in ("winner", "baseline_remeasured"):
            out[key] = dataclasses.asdict(out[key]) if out[key] is not None else None
        out["remeasured"] = self.remeasured.to_dict() if self.remeasured else self.remeasured
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        kw = {f.name: data.get(f.name) for f in dataclasses.fields(cls)}
        kw["winner"], kw["baseline_remeasured"] = _record(kw["winner"]), _record(kw["baseline_remeasured"])
        kw["remeasured"] = Remeasured.from_dict(kw["remeasured"])
        return cls(**kw)


@dataclass(frozen=True)
class PredictionError:
    """Pre-launch predictions vs measurements over the launched trials that ran."""

    n_memory: int = 0
    memory_error_pct_median: float | None = None  # |predicted - measured| / measured
    memory_error_pct_max: float | None = None
    n_speed: int = 0
    speed_ratio_median: float | None = None  # measured decode_tps / predicted upper bound
    speed_over_bound: int = 0  # trials faster than their predicted upper bound (+5%)
    n_expect: int = 0  # trials with a measured metric the prediction expected (predict.expect)
    expect_off_median: dict[str, float] | None = None  # per metric: median of measured - expected

    def lines(self) -> list[str]:
        """How far the pre-launch predictions were from what was measured, one sentence each
        (the console's summary and the report page say the same)."""
        parts = ([f"memory error median {self.memory_error_pct_median:g}% (n={self.n_memory})"]
                 if self.n_memory else [])
        if self.n_speed:
            parts.append(f"decode {self.speed_ratio_median:g}x of the predicted upper bound "
                         f"(n={self.n_speed}, {self.speed_over_bound} above it)")
        return (["prediction vs measured: " + "; ".join(parts)] if parts else []) + [
            f"expected vs measured (predict.expect): {metric} measured {off:+g} from what was expected, "
            f"median over {self.n_expect} trials" for metric, off in (self.expect_off_median or {}).items()]


def prediction_error(rows: list[tuple[Prediction, dict[str, float]]]) -> PredictionError | None:
    """``rows``: (the trial's pre-launch prediction, its measured metrics) per trial."""
    mem, ratio, off = [], [], {}
    for pred, metrics in rows:
        c = compare(pred, metrics)
        if "mem_pred_error_pct" in c:
            mem.append(abs(c["mem_pred_error_pct"]))
        if "decode_bound_ratio" in c:
            ratio.append(c["decode_bound_ratio"])
        for metric, expected in pred.expect:
            if math.isfinite(measured := metrics.get(metric, math.nan)):
                off.setdefault(metric, []).append(measured - expected)
    if not mem and not ratio and not off:
        return None
    return PredictionError(
        n_memory=len(mem),
        memory_error_pct_median=round(statistics.median(mem), 1) if mem else None,
        memory_error_pct_max=round(max(mem), 1) if mem else None,
        n_speed=len(ratio),
        speed_ratio_median=round(statistics.median(ratio), 3) if ratio else None,
        speed_over_bound=sum(r > 1.05 for r in ratio),
        n_expect=max((len(v) for v in off.values()), default=0),
        expect_off_median={m: round(statistics.median(v), 3) for m, v in off.items()} or None,
    )

@dataclass(frozen=True)
class Headroom:
    """The winner against the box's limits: its roofline share and its energy per token.

    ``roofline_pct``: the winner's decode_tps / ``roofline_tps`` (the memory-bandwidth bound
    at the workload's context, reading ``read_mb_per_token`` MiB per step at ``bandwidth``);
    ``note``: why it is unknown. ``energy_j_per_token`` / ``energy_note`` likewise.
    """

    roofline_pct: float | None = None
    roofline_tps: float | None = None
    read_mb_per_token: float | None = None
    bandwidth: str = ""
    note: str = ""
    energy_j_per_token: float | None = None
    energy_note: str = ""

    def roofline_words(self) -> str:
        """"the winner runs at 48% of this box's memory-bandwidth limit (...)", or the note."""
        if self.roofline_pct is None:
            return self.note
        return (f"the winner runs at {self.roofline_pct:.0f}% of this box's memory-bandwidth limit "
                f"({self.read_mb_per_token:.0f} MB read per decode step at {self.bandwidth}: at most "
                f"{self.roofline_tps:.0f} tok/s per stream)")

    def energy_words(self) -> str:
        """"energy 0.41 J per token (...)", or why there is none."""
        if self.energy_j_per_token is None:
            return self.energy_note
        return f"energy {self.energy_j_per_token:.3g} J per output token ({self.energy_note})"


def baseline_label(engine: str) -> str:
    """How the summary names the baseline of ``engine`` (its ``Engine.baseline_label``)."""
    try:
        return get_engine_class(engine).baseline_label
    except ConfigError:  # a study recorded by an engine this install no longer has
        return "the engine defaults"


@dataclass(frozen=True, kw_only=True)
class StudySummary(Remeasurement):
    """Everything ``summary.json`` holds: counts, baseline vs winner, verdict, warnings.

    ``n_trials`` counts launched configurations (the budget); proposals refused before
    launch (``n_rejected``) and repeats of a measured configuration (``n_duplicates``)
    are counted apart.
    """

    study: str
    engine: str
    interrupted: bool
    search: str = "single"
    n_trials: int = 0
    n_rejected: int = 0
    n_duplicates: int = 0
    n_feasible: int = 0
    n_failed: int = 0
    n_infeasible: int = 0
    n_stopped: int = 0  # stopped early (study.early_stop): PRUNED, counted in n_trials
    elapsed_s: float = 0.0
    overhead_s: float | None = None  # the driver's own time in elapsed_s (asks, pool, tells, logs)
    objectives: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    workload: dict = field(default_factory=dict)
    baseline: Record | None = None
    winner: Record | None = None
    pareto: list[int] = field(default_factory=list)
    winner_metrics: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    stop_reason: str | None = None
    prediction: PredictionError | None = None
    headroom: Headroom | None = None

    def baseline_words(self) -> str | None:
        """What is wrong with the baseline the speed-up is stated over, when it is not the
        winner and did not meet the constraints: ``the baseline (trial #0) broke ttft_p95_ms
        <= 200 (measured 222)``, or how its launch failed. None when it is feasible."""
        base, win = self.baseline, self.winner
        if base is None or win is None or base.number == win.number or base.feasible:
            return None
        if base.status != "ok":
            why = " ".join(base.reason.split())[:200]
            return f"the baseline (trial #{base.number}) {base.status}" + (f": {why}" if why else "")
        return f"the baseline (trial #{base.number}) {base.broken() or 'is infeasible'}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in _OPTIONAL and value is None:
                continue
            if isinstance(value, (Record, PredictionError, Headroom)):
                value = dataclasses.asdict(value)
            elif isinstance(value, Remeasured):
                value = value.to_dict()
            out[f.name] = value
        return out

    def to_json(self) -> str:
        """The text of ``summary.json`` (indented JSON and a final newline)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=False, default=str) + "\n"

    def with_warnings(self, notes: list[str]) -> StudySummary:
        """A copy with ``notes`` appended to the warnings (the export checks' notes)."""
        return dataclasses.replace(self, warnings=[*(self.warnings or []), *notes]) if notes else self

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudySummary:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in data.items() if k in names}
        kw["baseline"], kw["winner"] = _record(kw.get("baseline")), _record(kw.get("winner"))
        if kw.get("prediction") is not None:
            kw["prediction"] = PredictionError(**kw["prediction"])
        if kw.get("headroom") is not None:
            kw["headroom"] = Headroom(**kw["headroom"])
        kw["remeasured"] = Remeasured.from_dict(kw.get("remeasured"))
        return cls(**kw)

    @classmethod
    def load(cls, path: Path) -> StudySummary:
        """Read a ``summary.json`` file."""
        return cls.from_dict(json.loads(Path(path).read_text()))
