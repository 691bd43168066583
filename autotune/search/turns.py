"""The turns that overrule the model's own choice (issue 41): the lazy cover and the local search.

bo's :class:`~autotune.search.bo.PoolSampler` asks these at each model ask. :func:`cover_rows`: the
free pool rows that show a level or branch no trial shows yet (``design.COVER_LAZY``: without a
prior the design no longer grows to cover every level; bo shows each missing level on its
1st, 3rd, 5th ... model ask). :func:`lines` and :func:`turn`: the edge probes and the trust
region of :mod:`autotune.search.local` (both off by default: neither helped on the tune
instances, bench/results/efficiency.txt).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING
from typing import Any

import numpy as np
from optuna.trial import TrialState

from autotune.search import design
from autotune.search import local
from autotune.search.design import config_key
from autotune.search.design import trial_params
from autotune.search.trials import trial_attrs

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from autotune.search.pool import Pool
    from autotune.search.space import Space


def lines(pool: Pool, space: Space, centres: np.ndarray) -> list[dict[str, Any]]:
    """The configurations on each ordered knob's line through each centre (pool rows);
    a sampled pool grows by them."""
    configs = [c for r in centres for p in local.ordered_knobs(space)
               for c in local.line(space, pool.params[r], p)]
    if pool.space is not None:
        pool.grow(configs)
    return configs


def cover_rows(pool: Pool, space: Space, trials: list[FrozenTrial], rng: np.random.Generator) -> list[int]:
    """Free pool rows that show a level or branch no trial shows yet (design.COVER_LAZY)."""
    shown = [trial_params(t) for t in trials]
    missing = [t for t in design.cover_targets(space) if not any(design.shows(c, t) for c in shown)]
    if not missing:
        return []
    told = {config_key(c) for c in shown}
    rows: list[int] = []
    for target in missing:  # the first level that a free, launchable configuration holds
        rows = [i for i, c in enumerate(pool.params)
                if design.shows(c, target) and pool.keys[i] not in told]
        if rows:
            break
    if len(rows) > 2000:
        rows = rng.choice(rows, 2000, replace=False).tolist()
    return rows


def turn(pool: Pool, space: Space, cand: np.ndarray, score: np.ndarray, cover: list[int], centres: np.ndarray,
         lines: list[dict[str, Any]], gp: Any, prior: np.ndarray, keys: dict[int, str],
         trials: list[FrozenTrial], y: np.ndarray, feasible: np.ndarray, rows_ok: np.ndarray,
         p_feasible: np.ndarray, logged: bool) -> int | None:
    """The pool row a cover or local turn proposes (None: the model's own choice)."""
    shown = pick(cand, score, cover)
    if shown is not None:
        return shown
    if not lines or not len(centres):
        return None
    where = {int(r): i for i, r in enumerate(cand)}
    line_rows = np.array(sorted({pool.index[k] for k in map(config_key, lines) if k in pool.index}), dtype=int)
    mean = dict(zip(line_rows.tolist(), (gp.predict(pool.X[line_rows])[0] + prior[line_rows]).tolist()))
    by_row = {int(r): float(v) for r, v, f in zip(rows_ok, y, feasible)}
    feas = {int(r) for r, f in zip(rows_ok, feasible) if f}
    done = {k for t in trials for k in [keys[t.number]] if t.state in (TrialState.COMPLETE, TrialState.FAIL)}
    launched = {pool.index[keys[t.number]] for t in trials if keys[t.number] in pool.index
                and trial_attrs(t).kind == "launched"}
    told = set(keys.values())

    def know(c: dict[str, Any]) -> local.Known:
        key = config_key(c)
        r = pool.index.get(key)
        if r is None:  # refused by the engine's check or fit prediction
            return local.Known(measured=key in told, launchable=False)
        m = mean.get(r, 0.0)
        if r in launched:
            return local.Known(True, by_row.get(r) if r in feas else None, m)
        if key in done:  # told without a launch (refused before it)
            return local.Known(True, None, m, launchable=False)
        if r in where:
            return local.Known(False, None, m, float(p_feasible[where[r]]))
        return local.Known(True, m, m)  # in flight: neither a probe nor an edge

    probes: list[int] = []
    if local.EDGE:
        cliff_at = math.log(local.CLIFF) if logged else -math.inf
        for r in centres:
            cliff = by_row[int(r)] + cliff_at
            probes += [pool.index[config_key(c)] for c in local.edge_probes(space, pool.params[r], cliff, know)
                       if config_key(c) in pool.index and pool.index[config_key(c)] in where]
    if not probes and local.TRUST:
        probes = cand[local.near(pool.X, cand, centres)].tolist()
    if not probes:
        return None
    idx = np.array([where[r] for r in dict.fromkeys(probes)])
    return int(cand[idx[np.argmax(score[idx])]])


def pick(cand: np.ndarray, score: np.ndarray, rows: list[int]) -> int | None:
    """The pool row among ``rows`` that ``cand`` holds with the highest ``score`` (None: none)."""
    mask = np.isin(cand, rows) if rows else np.zeros(len(cand), dtype=bool)
    return int(cand[np.flatnonzero(mask)[np.argmax(score[mask])]]) if mask.any() else None
