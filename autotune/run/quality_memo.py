"""Quality measured once per quality key: what a trial reuses instead of measuring again.

An engine names the knobs that change its output distribution (``Engine.quality_knobs``:
for llama.cpp the model variant and the K/V cache types). Two trials that agree on those
knobs (defaults filled in, the variant's definition included) have the same perplexity and
KLD up to rounding, so the second reuses the first's numbers and records which trial
measured them (``quality_from``). An engine that does not name its knobs (``None``) measures
every trial; so does a study with ``quality.reuse: false``.

A proposal whose quality key was measured and broke a constraint on a quality metric
(``ppl_delta_pct <= 2``, a KLD bound) cannot be feasible whatever its other knobs do: the
driver refuses it before launching (:meth:`QualityMemo.breaks`), which saves its load and its
workload (issue 43: 60-90 s + 60 s on a 70B). A trial in flight that measures the same key
does not hold a new proposal back: a slot left idle costs more than the load it might save.

The command engine measures quality itself (its command prints ``ppl_delta_pct``...) and names
its quality knobs where the user declares them (``engine.settings.quality_knobs``): those
numbers are remembered the same way, for the refusal only; they are never reused, since the
command measures them whatever autotune says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from autotune._files import write_atomic
from autotune.measure.quality import QUALITY_METRICS
from autotune.search import trials as trialslib

if TYPE_CHECKING:
    import optuna

    from autotune.config.schema import Config
    from autotune.engines.base import Engine
    from autotune.trial.spec import TrialResult


def quality_key(engine: type[Engine], params: dict[str, Any], settings: dict, variants: dict) -> str | None:
    """The values of ``engine.quality_knobs`` for ``params`` over the engine's defaults, and
    the model variant's definition, as one string (None: the engine names no such knobs)."""
    knobs = engine.quality_knobs_for(settings)
    if knobs is None:
        return None
    full = {**engine.default_params(settings, variants), **params}
    model = full.get("model")
    return json.dumps([{k: full.get(k) for k in knobs},
                       variants.get(model) if isinstance(model, str) else None], sort_keys=True, default=str)


class QualityMemo:
    """Quality metrics by quality key, each with the trial that measured them (driver side)."""

    def __init__(self, cfg: Config, engine: type[Engine]) -> None:
        self.knobs = engine.quality_knobs_for(cfg.engine.settings)
        # autotune's own quality pass, or the numbers a command measures itself (never reused)
        self.on = cfg.quality.reuse and (cfg.quality.enabled or not engine.supports_quality)
        self.reuses = cfg.quality.enabled
        self.cfg, self.engine = cfg, engine
        self.by_key: dict[str, tuple[int, dict[str, float]]] = {}

    def key(self, params: dict[str, Any]) -> str | None:
        """``params``' quality key (None when reuse is off or the engine names no knobs)."""
        if not self.on:
            return None
        return quality_key(self.engine, params, self.cfg.engine.settings, self.cfg.engine.variants)

    def lookup(self, params: dict[str, Any]) -> tuple[int, dict[str, float]] | None:
        """(the trial that measured it, its quality metrics) for ``params``' key, if measured."""
        key = self.key(params)
        return self.by_key.get(key) if key is not None else None

    def reusable(self, params: dict[str, Any]) -> tuple[int, dict[str, float]] | None:
        """What a trial of ``params`` reuses instead of its own quality pass (None: it measures)."""
        return self.lookup(params) if self.reuses else None

    def breaks(self, params: dict[str, Any]) -> str | None:
        """Why ``params`` cannot be feasible: its quality key was measured and breaks a
        constraint on a quality metric (the reason names the trial that measured it), or None."""
        found = self.lookup(params)
        if found is None:
            return None
        number, quality = found
        broken = [f"{c.metric} = {quality[c.metric]:.4g} breaks {c}" for c in self.cfg.constraints
                  if c.metric in quality and c.violation(quality[c.metric]) > 0]
        if not broken:
            return None
        return (f"quality measured by trial {number} (same {', '.join(self.knobs or ())}): "
                f"{'; '.join(broken)}: not launched")

    def remember(self, number: int, params: dict[str, Any], metrics: dict[str, float],
                 measured_by: int | None = None) -> None:
        """Keep the quality metrics of a finished trial (the first measurement of a key wins)."""
        key = self.key(params)
        quality = {k: v for k, v in metrics.items() if k in QUALITY_METRICS}
        if key is not None and quality and key not in self.by_key:
            self.by_key[key] = (number if measured_by is None else measured_by, quality)

    def recall(self, study: optuna.Study) -> None:
        """Remember the quality of every launched trial of a (resumed) study."""
        for t in study.get_trials(deepcopy=False):
            a = trialslib.trial_attrs(t)
            if a.kind == trialslib.LAUNCHED and a.status in ("ok", "stopped") and a.params is not None:
                self.remember(t.number, a.params, a.metrics, a.quality_from)

    def settle(self, number: int, params: dict[str, Any], result: TrialResult, quality_from: int | None,
               result_path: Path) -> tuple[TrialResult, dict[str, Any] | None]:
        """A finished trial's result with the quality it reused (``quality_from``: the trial
        that measured it, None when it measured its own), and the attributes that say so.
        The merged result is written to ``result_path`` too (``autotune repair`` tells
        ``trials/NNNN/result.json`` again)."""
        attrs = None
        if quality_from is not None and result.ok:
            _, quality = self.lookup(params)
            result = result.replace(metrics={**result.metrics, **quality},
                                    info={**result.info, "quality_from": quality_from})
            attrs = {"quality_from": quality_from}
            write_atomic(result_path, result.to_json())
        if result.ok or result.status == "stopped":  # a stop on a quality slice: its key breaks a bound
            self.remember(number, params, result.metrics, quality_from)
        return result, attrs
