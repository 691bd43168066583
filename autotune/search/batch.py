"""What trials still in flight mean for ``bo``'s next proposal (``ray.max_concurrent > 1``).

With several slots, the sampler is asked while other trials run. Proposing as if they did
not exist sends every slot to the same hill; :mod:`autotune.search.bo` offers three answers,
measured side by side in ``bench/slots.py``:

* ``believer`` (kriging believer): each trial in flight is added to the GP at its posterior
  mean. The mean is unchanged and only the variance near it shrinks, so a proposal next to
  a promising trial in flight still scores well when the mean there is high.
* ``fantasy``: the outcomes of the trials in flight are drawn jointly from the posterior
  (``N_FANTASIES`` draws, each a "fantasy"); the expected improvement of a candidate is
  averaged over the fantasies, each with its own posterior and its own incumbent (the best
  of what was measured and what the fantasy says the trials in flight returned, where they
  are feasible in that draw). This is the Monte-Carlo batch EI of Snoek, Larochelle & Adams
  (2012): a candidate gains only where it is likely to beat what is already running.
* ``penalize`` (local penalization, González et al. 2016): the EI of the GP without the
  trials in flight, times, for each of them, the probability that the candidate lies
  outside the ball that trial probably excludes: radius ``(best - mean there) / L`` in
  length-scale units, ``L`` a Lipschitz constant of the posterior mean estimated on the
  candidates.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.linalg import cho_solve
from scipy.linalg import cholesky
from scipy.linalg import solve_triangular
from scipy.spatial.distance import cdist
from scipy.stats import norm

MODES = ("believer", "fantasy", "penalize")
N_FANTASIES = 16


def log_ei(mu: np.ndarray, sd: np.ndarray, best: float | np.ndarray) -> np.ndarray:
    """log expected improvement of N(mu, sd) over ``best`` (floored, never -inf)."""
    z = (mu - best) / sd
    return np.log(np.maximum(sd * (z * norm.cdf(z) + norm.pdf(z)), 1e-300))


def fantasy_log_ei(gp: Any, Xp: np.ndarray, prior_p: np.ndarray, pf_p: np.ndarray, Xc: np.ndarray,
                   prior_c: np.ndarray, best: float, rng: np.random.Generator,
                   n: int = N_FANTASIES) -> np.ndarray:
    """log of the EI of each candidate ``Xc`` averaged over ``n`` fantasies of the trials in
    flight ``Xp``.

    ``gp`` is the fitted scikit-learn regressor (``normalize_y=True``) of the residual the
    objective is modelled on; ``prior_*`` are the prior means added back; ``pf_p`` is each
    trial in flight's probability of being feasible. Every fantasy shares the posterior
    variance (it depends on where, not on what, was measured); only the means and the
    incumbents differ, so the candidates' kernel rows are computed once.
    """
    kernel, m, s = gp.kernel_, float(gp._y_train_mean), float(gp._y_train_std)
    mean_p, cov_p = gp.predict(Xp, return_cov=True)
    draws = rng.multivariate_normal(mean_p, cov_p, size=n, method="eigh")  # (n, pending)
    Xa = np.vstack([gp.X_train_, Xp])
    ya = np.vstack([np.repeat(np.ravel(gp.y_train_)[:, None], n, axis=1), ((draws - m) / s).T])
    K = kernel(Xa)
    K[np.diag_indices_from(K)] += gp.alpha
    L = cholesky(K, lower=True)
    Kca = kernel(Xc, Xa)
    mu = Kca @ cho_solve((L, True), ya) * s + m + prior_c[:, None]  # (candidates, n)
    V = solve_triangular(L, Kca.T, lower=True)
    sd = np.sqrt(np.maximum(kernel.diag(Xc) - np.einsum("ij,ij->j", V, V), 1e-18)) * s
    sd = np.maximum(sd, 1e-9)
    feasible = rng.random(draws.shape) < pf_p[None, :]
    incumbent = np.maximum(best, np.max(np.where(feasible, draws + prior_p[None, :], -np.inf), axis=1))
    z = (mu - incumbent[None, :]) / sd[:, None]
    ei = sd[:, None] * (z * norm.cdf(z) + norm.pdf(z))
    return np.log(np.maximum(ei.mean(axis=1), 1e-300))


def length_scale(kernel: Any, n_features: int) -> np.ndarray:
    """The Matern length scales of ``kernel`` (one per feature)."""
    from sklearn.gaussian_process.kernels import Matern

    for k in kernel.get_params().values():
        if isinstance(k, Matern):
            return np.broadcast_to(np.asarray(k.length_scale, dtype=float), (n_features,))
    return np.ones(n_features)


def log_penalty(Xc: np.ndarray, mu_c: np.ndarray, Xp: np.ndarray, mu_p: np.ndarray, sd_p: np.ndarray,
                best: float, scale: np.ndarray, rng: np.random.Generator, sample: int = 400) -> np.ndarray:
    """Sum over the trials in flight of log P(candidate outside the ball it excludes).

    Distances are Euclidean in length-scale units; ``L`` is the largest slope of the
    posterior mean ``mu_c`` between ``sample`` candidates drawn at random (a lower bound on
    the true Lipschitz constant, as González et al. estimate it)."""
    Zc, Zp = Xc / scale, Xp / scale
    pick = rng.choice(len(Zc), min(sample, len(Zc)), replace=False)
    d = cdist(Zc[pick], Zc[pick])
    slope = np.abs(mu_c[pick][:, None] - mu_c[pick][None, :]) / np.where(d > 1e-9, d, np.inf)
    lipschitz = max(float(slope.max()), 1e-6)
    dist = cdist(Zc, Zp)  # (candidates, pending)
    return norm.logcdf((lipschitz * dist - best + mu_p[None, :]) / sd_p[None, :]).sum(axis=1)
