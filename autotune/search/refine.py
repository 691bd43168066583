"""Candidates near the best measured configurations, for a pool that is only a sample.

A space with a continuous knob (or more than ``POOL_LIMIT`` configurations) is represented
in ``bo``'s pool by a few thousand random configurations, and an optimum on a narrow ridge
may not be among them: on ``bench/surfaces/vllm_h100`` (the best ``gpu_memory_utilization``
sits one step below a crash edge) the 4,000-configuration pool held 1 to 3 of the 30
configurations within 95% of the optimum. :func:`neighbours` gives what the pool grows by
around a measured configuration: each knob moved alone over its values (a continuous or long
one on a grid, plus small steps either side of the current value), and each choice changed
together with the continuous knobs' small steps, since the edge moves with the choices.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING
from typing import Any

from autotune.search.design import config_key
from autotune.search.design import from_unit
from autotune.search.design import to_unit

if TYPE_CHECKING:
    from autotune.search.space import Param
    from autotune.search.space import Space

GRID = 33  # values of a continuous (or long) knob across its range
STEPS = (0.005, 0.01, 0.02, 0.04, 0.08)  # and either side of the current value (share of the range)


def _long(p: Param) -> bool:
    vals = p.values()
    return vals is None or len(vals) > GRID


def _values(p: Param, current: Any) -> list[Any]:
    """The values ``p`` is tried at: all of them when few, else a grid and steps near ``current``."""
    if not _long(p):
        return list(p.values() or ())
    return [from_unit(p, min(u, 0.999999)) for u in [i / (GRID - 1) for i in range(GRID)]] + _near(p, current)


def _near(p: Param, current: Any) -> list[Any]:
    if current is None:
        return []
    u = to_unit(p, current)
    return [from_unit(p, min(max(u + s * sign, 0.0), 0.999999)) for s in STEPS for sign in (-1, 1)]


def neighbours(space: Space, center: dict[str, Any]) -> list[dict[str, Any]]:
    """Configurations one knob from ``center``, and one choice from it with every long knob
    stepped near its value. A conditional knob that becomes active takes a value drawn at
    random, the same each time for the same ``center`` (a repeat adds nothing new)."""
    rng = random.Random(config_key(center))
    dims = [p for p in space.params.values() if p.dist is not None]
    fill = {p.name: p.sample(rng) for p in dims}  # values for knobs that become active
    base = {**fill, **center}
    out = []
    for p in dims:
        for v in _values(p, center.get(p.name)):
            out.append(space.restrict({**base, p.name: v}))
    longs = [p for p in dims if _long(p)]
    for p in dims:
        if _long(p):
            continue
        for v in p.values() or ():
            moved = {**base, p.name: v}
            for q in longs:
                for w in _near(q, center.get(q.name)):
                    out.append(space.restrict({**moved, q.name: w}))
    return out
