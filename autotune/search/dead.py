"""Dead levels (issue 41): a knob's level that failed every launch that held it.

A level can make every launch fail whatever the other knobs are: a context too short for the
workload's prompt, a cache type the build lacks. bo's launch model (a GP over +1 ran / -1
failed) spreads each failure over the features it shares with the others, and on the MoE
family a study spent up to four of its twenty launches on a context that never runs. With
``DEAD`` on, a level of a knob with few values (a choice, or a short integer range) launched
at least ``MIN_FAILS`` times, every time failed and never run, is left out of the candidates
(unless nothing else is left). Off by default; bench/efficiency.py ``--variant dead``.

Dropped on the tune instances (moe_30b 1000-1017: 5/18 at 95% by trial 20 against 5/18, median
best@20 0.529 against 0.609; vllm_h100 unchanged): a level that failed for want of memory is
dead only together with other knobs (a quant that ran out of memory twice at little offload
fits at more), and pruning it can leave nothing feasible (moe 1008: 0.646 -> 0.000). A failure's
kind (out of memory against a level that cannot run) tells them apart: ``KIND`` (variant
deadkind) keeps 1008 at 0.646, and ties the default too (5/18; median 0.590 against 0.609,
worst decile 0.304 against 0.000).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

DEAD = False
MIN_FAILS = 2  # failed launches, none run, before a level counts as dead
MAX_LEVELS = 16  # only knobs with at most this many values have levels
# KIND: a failure whose reason reads as running out of memory does not count toward a dead level
# (a quant or context that ran out of memory may fit with other knobs); bench variant deadkind
KIND = False
MEMORY = re.compile(r"out of memory|\boom\b|cudamalloc|alloc(ate|ation)? failed|failed to allocate", re.I)


def levels(space: Any, launched: Sequence[tuple[dict[str, Any], bool, str]]) -> set[tuple[str, Any]]:
    """The dead (knob, value) pairs of ``launched`` (config, ran, the failure's reason) triples."""
    failed, ran = Counter(), Counter()
    for params, ok, reason in launched:
        if not ok and KIND and MEMORY.search(reason or ""):
            continue  # out of memory: the level may fit with other knobs
        for name, value in params.items():
            p = space.params.get(name)
            vals = None if p is None or p.dist is None else p.values()
            if vals is not None and len(vals) <= MAX_LEVELS:
                (ran if ok else failed)[(name, value)] += 1
    return {k for k, n in failed.items() if n >= MIN_FAILS and not ran[k]}


def prune(cand: np.ndarray, params: Sequence[dict[str, Any]], dead: set[tuple[str, Any]]) -> np.ndarray:
    """``cand`` (pool rows) less those holding a dead level; ``cand`` itself if none is left."""
    if not dead:
        return cand
    keep = np.array([not any((k, v) in dead for k, v in params[int(r)].items()) for r in cand], dtype=bool)
    return cand[keep] if keep.any() else cand


def filter_rows(space: Any, pool: Any, cand: np.ndarray, launched: Sequence[Any], row: dict[int, int]) -> np.ndarray:
    """bo's hook: ``cand`` less the rows holding a dead level of the ``launched`` trials (as it is
    when ``DEAD`` is off)."""
    if not DEAD:
        return cand
    from autotune.search.trials import trial_attrs

    return prune(cand, pool.params, levels(space, [(pool.params[row[t.number]], trial_attrs(t).status == "ok",
                                                    trial_attrs(t).reason) for t in launched]))
