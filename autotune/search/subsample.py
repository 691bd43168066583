"""Which measured trials a GP of :mod:`autotune.search.bo` is fitted on, and which pool
configurations it scores: caps that keep one ask bounded on a long study over a huge pool, while
keeping the best, what is near the best and a random rest.
"""

from __future__ import annotations

import numpy as np


def train_rows(score: np.ndarray, feasible: np.ndarray, cap: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of at most ``cap`` measured trials a GP is fitted on: all of them when there are
    few, else the best quarter by ``score`` among the ``feasible``, the best quarter overall and
    the rest drawn at random (what is far from the best still shapes the model)."""
    n = len(score)
    if n <= cap:
        return np.arange(n)
    order = np.argsort(-score, kind="stable")
    keep = list(dict.fromkeys(int(i) for i in [*order[feasible[order]][: cap // 4], *order[: cap // 4]]))
    rest = np.setdiff1d(np.arange(n), keep)
    return np.sort(np.concatenate([keep, rng.choice(rest, cap - len(keep), replace=False)]).astype(int))


def candidate_rows(X: np.ndarray, free: np.ndarray, log_bound: np.ndarray | None, best: np.ndarray,
                   cap: int, rng: np.random.Generator) -> np.ndarray:
    """Positions in ``free`` of at most ``cap`` configurations to score: all of them when there
    are few, else the highest-predicted eighth, an eighth nearest the ``best`` measured pool
    rows (L1 in features) and the rest drawn at random."""
    if len(free) <= cap:
        return np.arange(len(free))
    keep: list[int] = []
    if log_bound is not None:
        keep += np.argpartition(-log_bound[free], cap // 8)[: cap // 8].tolist()
    per = cap // 8 // max(len(best), 1)
    Xf = X[free]
    for b in best:
        keep += np.argpartition(np.abs(Xf - X[b]).sum(axis=1), per)[:per].tolist()
    keep = list(dict.fromkeys(keep))
    rest = np.setdiff1d(np.arange(len(free)), keep)
    return np.concatenate([keep, rng.choice(rest, cap - len(keep), replace=False)]).astype(int)
