"""A quality constraint keyed by its knobs (issue 41): perplexity depends on the quality knobs alone.

An engine names the knobs that change its output distribution (``Engine.quality_knobs``; a
``command`` engine declares them as ``engine.settings.quality_knobs``): the quant and the KV
cache types, never the offload, the batch or the threads. bo's GP of a quality constraint
(``ppl_delta_pct <= 1.0``, any metric of :data:`~autotune.measure.quality.QUALITY_METRICS`)
then models it over those knobs' features only, so a bound measured broken for a quality key
holds every configuration with that key infeasible (up to the measurement's noise) without
another launch, one measured to hold clears them all, and a key never measured is as
uncertain as its distance from the measured keys in quant and KV type, not in the other
knobs. ``KEYED``: off by default (bench/efficiency.py --variant keyed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from autotune.measure.quality import QUALITY_METRICS
from autotune.search.pool import _ordered

if TYPE_CHECKING:
    from autotune.search.space import Space

KEYED = False


def knobs(space: Space) -> tuple[str, ...]:
    """The quality knobs the engine or its settings name (empty: none named)."""
    named = getattr(space.engine, "quality_knobs", None)
    if not named:
        s = space.settings
        named = s.get("quality_knobs") if isinstance(s, dict) else getattr(s, "quality_knobs", None)
    return tuple(named or ())


def columns(space: Space, metric: str, ordered: bool = True) -> np.ndarray | None:
    """The pool feature columns (:func:`autotune.search.pool.featurize`'s layout) of the quality
    knobs, for a quality ``metric``'s GP; None: every column (off, not a quality metric, no knob
    named, or none of them searched)."""
    names = knobs(space)
    if not KEYED or metric not in QUALITY_METRICS or not names:
        return None
    out, i = [], 0
    for p in space.params.values():
        if p.dist is None:
            continue
        width = 1 if _ordered(p, ordered) else len(p.values())
        if p.name in names:
            out.extend(range(i, i + width))
        i += width + (1 if p.when is not None else 0)
    return np.array(out, dtype=int) if out else None
