"""Expected hypervolume improvement in two objectives, exact, for ``bo``'s Pareto search.

Both objectives are maximised (a minimised one enters negated). The measured front
``(a_1, b_1), ..., (a_m, b_m)``, sorted by ``a`` falling (so ``b`` rises), and the reference
point ``r`` split the region a new point could add into ``m + 1`` vertical strips: strip
``i`` spans ``a`` in ``(max(a_{i+1}, r_a), a_i]`` (``a_0 = inf``) and is already covered up
to ``b = b_i`` (``b_0 = r_b``). A point ``(x, z)`` adds, in strip ``i``, the length of the
strip left of ``x`` times ``max(0, z - b_i)``. With ``x`` and ``z`` independent Gaussians
(one GP per objective) the expectation of each product is the product of two closed forms,
``E[clip(x - lo, 0, hi - lo)] * E[max(0, z - b_i)]``: the EHVI of Emmerich et al. (2006) in
its 2-D strip form, computed here in logs so that a candidate far behind the front still
ranks by how far.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from autotune.search.batch import log_ei


def nondominated_rows(points: np.ndarray) -> np.ndarray:
    """Indices of the rows of ``points`` (every column maximised) that no other row dominates."""
    return np.array([i for i, p in enumerate(points)
                     if not np.any(np.all(points >= p, axis=1) & np.any(points > p, axis=1))], dtype=int)


def nondominated(points: np.ndarray) -> np.ndarray:
    """The rows of ``points`` (n, 2) that no other row dominates (both maximised), deduplicated."""
    pts = np.unique(np.asarray(points, dtype=float), axis=0)
    return pts[nondominated_rows(pts)]


def reference(points: np.ndarray, span: np.ndarray | None = None, margin: float = 0.1) -> np.ndarray:
    """A reference point below every row of ``points``: the worst value of each objective less
    ``margin`` of its range there (where that range is nil: of ``span``, else 1)."""
    lo, hi = points.min(axis=0), points.max(axis=0)
    fallback = np.ones_like(lo) if span is None else np.where(np.asarray(span) > 0, span, 1.0)
    return lo - margin * np.where(hi > lo, hi - lo, fallback)


def log_ehvi(mu: np.ndarray, sd: np.ndarray, front: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """log EHVI of each candidate over ``front`` (m, 2) up to ``ref``; ``mu``, ``sd``: (n, 2)."""
    front = nondominated(front[np.all(front > ref, axis=1)]) if len(front) else front.reshape(0, 2)
    front = front[np.argsort(-front[:, 0])]
    a = np.concatenate([[np.inf], front[:, 0], [ref[0]]])
    lo = np.maximum(a[1:], ref[0])  # strip i: a in (lo_i, hi_i], covered up to floor_i
    hi = a[:-1]
    floor = np.concatenate([[ref[1]], front[:, 1]])
    mx, sx = mu[:, :1], sd[:, :1]
    la = log_ei(mx, sx, lo[None, :])
    lb = np.where(np.isfinite(hi)[None, :], log_ei(mx, sx, np.where(np.isfinite(hi), hi, 0.0)[None, :]), -np.inf)
    log_len = la + np.log1p(-np.exp(np.minimum(lb - la, -1e-12)))
    log_gain = log_ei(mu[:, 1:], sd[:, 1:], floor[None, :])
    return logsumexp(log_len + log_gain, axis=1)
