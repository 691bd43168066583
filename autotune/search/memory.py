"""Memory as a learned constraint (issue 41): whether a configuration fits the card, from a few
measured peaks instead of a crash per region.

Every launch that ran reports its peak GPU memory (``vram_peak_gb``); one that ran out of memory
says so in its reason (``cudaMalloc failed: out of memory``, ``torch.OutOfMemoryError``). Memory is
nearly additive over the knobs (weights on the GPU, the KV cache, the buffers), so a GP with a
linear part (scikit-learn's ``DotProduct`` plus a Matern 5/2, fitted noise) over the pool's
features predicts it for a configuration never launched, e.g. a heavier quant at more offload.
An out-of-memory launch is a censored observation: it needed more than the card holds, so it
enters the fit at ``max(card, its prediction)`` (two rounds, a Tobit-like imputation). The card's
memory is what the user declared (``engine.settings.gpus``' ``memory_gb``, summed over the
trial's cards); without it there is no memory model (a launch that ran out of memory counts as
any other failure).

:func:`log_p_fits` gives log P(peak <= card) per candidate. bo multiplies it into P(feasible) and
its GP of "does it run" then learns only from the other failures (a context shorter than the
prompt, a crash), which memory does not explain. On by default where a card is declared, from the
first launch that ran out of memory (AFTER_OOM), a run at 99% of the card or more counted as out
of memory (FULL): the bench's variant memoomfull, chosen on tune instances (moe_30b 8/18 at 95% by
trial 20 against 5/18, median 0.867 against 0.609), judged on held-out instances (17/48 -> 20/48
over moe, vllm, llamacpp_7b and noisy in three prior modes; llamacpp_7b 5/6 against 6/6) and on the
hand-written surfaces' report seeds 100-119 (vllm_h100 physics 18/20 against 11/20, moe_30b
physics 18/20 against 15/20, 3 studies lost and 19 won of 240 paired; bench/results/efficiency.txt,
session 23). ``MEMORY = False`` turns it off.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from scipy.stats import norm

MEMORY = True
METRIC = "vram_peak_gb"
OOM_MARKERS = ("out of memory", "outofmemoryerror", "cudamalloc failed", "insufficient vram",
               "not enough memory", "cuda_error_out_of_memory")
LENGTH_SCALE_MIN = 0.3  # memory is smooth over a knob's range
CUT = 0.05  # P(fits) below this rules a candidate out (a crash costs a launch and teaches little)
MIN_RUNS = 3  # peaks measured before the model is trusted (with no out-of-memory failure seen)
# A run whose peak reads this share of the card or more sat at its limit: the driver's fallback
# to system memory (a spill) or one step from it. None: off; else such a run counts as out of
# memory (censored at the card) and leaves the objective's GP, whose smooth fit a run several
# times slower than its neighbours would drag down (bo's ``ok`` list, :func:`spilled`).
FULL: float | None = 0.99
AFTER_OOM = True  # True: no model until a launch ran out of memory (the card's edge was reached)
PAD = 0.02  # an out-of-memory launch enters at max(card, its prediction) + PAD x card


def is_oom(reason: str | None) -> bool:
    """Whether a failed launch's reason reads as running out of GPU memory."""
    text = (reason or "").lower()
    return any(m in text for m in OOM_MARKERS)


def spilled(t: Any, card: float | None) -> bool:
    """Whether a trial that ran sat at the card's limit (see FULL)."""
    from autotune.search.trials import trial_attrs

    peak = trial_attrs(t).metrics.get(METRIC) if FULL and card and MEMORY else None
    return peak is not None and float(peak) >= FULL * card


def card_gb(settings: Any) -> float | None:
    """The declared GPUs' memory in GB, summed (None: nothing declared)."""
    gpus = (settings.get("gpus") if isinstance(settings, dict) else getattr(settings, "gpus", None)) or []
    total = 0.0
    for g in gpus:
        mem = g.get("memory_gb") if isinstance(g, dict) else getattr(g, "memory_gb", None)
        total += float(mem or 0.0)
    return total or None


MODEL = "gp"  # "ridge": Bayesian ridge over a quadratic basis; "gp": a GP with a linear part


class _Ridge:
    """scikit-learn's BayesianRidge over the features, their squares and pairwise products
    (memory adds up over the knobs, with products such as weights per layer x layers on the GPU);
    its shrinkage leaves a knob that costs no memory (threads) near zero weight."""

    def __init__(self, X: np.ndarray, y: np.ndarray) -> None:
        from sklearn.linear_model import BayesianRidge
        from sklearn.preprocessing import PolynomialFeatures

        self.basis = PolynomialFeatures(2, include_bias=False).fit(X)
        self.model = BayesianRidge().fit(self.basis.transform(X), y)

    def predict(self, X: np.ndarray, return_std: bool = False) -> Any:
        return self.model.predict(self.basis.transform(X), return_std=return_std)


class _LinearGP:
    """A linear trend (scikit-learn's BayesianRidge over the features: memory adds up over the
    knobs) plus a GP of what it leaves (Matern 5/2, one length scale per feature, fitted noise):
    the trend carries the prediction to configurations far from anything measured, a heavier
    quant at more offload, where a stationary GP would fall back to the mean."""

    def __init__(self, X: np.ndarray, y: np.ndarray, seed: int) -> None:
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel
        from sklearn.gaussian_process.kernels import Matern
        from sklearn.gaussian_process.kernels import WhiteKernel
        from sklearn.linear_model import BayesianRidge

        self.trend = BayesianRidge().fit(X, y)
        kernel = (ConstantKernel(0.1, (1e-4, 1e2)) * Matern(np.full(X.shape[1], 1.0), (LENGTH_SCALE_MIN, 20.0), nu=2.5)
                  + WhiteKernel(1e-2, (1e-4, 0.5)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.gp = GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=1,
                                               random_state=seed).fit(X, y - self.trend.predict(X))

    def predict(self, X: np.ndarray, return_std: bool = False) -> Any:
        mu_t, sd_t = self.trend.predict(X, return_std=True)
        mu, sd = self.gp.predict(X, return_std=True)
        return (mu_t + mu, np.hypot(sd, sd_t)) if return_std else mu_t + mu


def _gp(X: np.ndarray, y: np.ndarray, seed: int) -> Any:
    if MODEL == "ridge":
        return _Ridge(X, y)
    if MODEL == "lingp":
        return _LinearGP(X, y, seed)
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel
    from sklearn.gaussian_process.kernels import DotProduct
    from sklearn.gaussian_process.kernels import Matern
    from sklearn.gaussian_process.kernels import WhiteKernel

    kernel = (ConstantKernel(1.0, (1e-3, 1e3)) * DotProduct(1.0, (1e-2, 1e2))
              + ConstantKernel(0.1, (1e-4, 1e2)) * Matern(np.full(X.shape[1], 1.0), (LENGTH_SCALE_MIN, 20.0), nu=2.5)
              + WhiteKernel(1e-2, (1e-4, 0.5)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=1,
                                        random_state=seed).fit(X, y)


def log_p_fits(X_ran: np.ndarray, peaks: np.ndarray, X_oom: np.ndarray, Xc: np.ndarray,
               card: float | None, seed: int) -> np.ndarray | None:
    """log P(peak <= the card) for each row of ``Xc``, from the peaks (GB) measured at ``X_ran``
    and the out-of-memory launches at ``X_oom`` (None: too little to go on)."""
    if not card or len(peaks) < 2 or (not len(X_oom) and (AFTER_OOM or len(peaks) < MIN_RUNS)):
        return None
    limit = float(card)
    X = np.vstack([X_ran, X_oom]) if len(X_oom) else X_ran
    y = np.concatenate([peaks, np.full(len(X_oom), limit)])
    gp = _gp(X, y, seed)
    if len(X_oom):  # censored: each failed launch needed more than the card, at least its prediction
        y[len(peaks):] = np.maximum(limit, gp.predict(X_oom)) + PAD * limit
        gp = _gp(X, y, seed)
    mu, sd = gp.predict(Xc, return_std=True)
    lp = norm.logcdf((limit - mu) / np.maximum(sd, 1e-6))
    return np.where(lp < np.log(CUT), lp - 30.0, lp) if CUT else lp


def split(ok: list, launched: list, row: dict[int, int], X: np.ndarray, Xf: np.ndarray, settings: Any,
          seed: int) -> tuple[np.ndarray | None, list]:
    """bo's hook: (log P(fits) per row of ``Xf`` or None, the launches left for its GP of "does
    it run": all of them when the memory model is off or has too little, else all but the
    out-of-memory failures). ``ok``: trials that ran; ``launched``: every launch; ``row``: trial
    number -> pool row of ``X``."""
    from autotune.search.trials import trial_attrs

    if not MEMORY:
        return None, launched
    ran = [(row[t.number], float(trial_attrs(t).metrics[METRIC])) for t in ok
           if np.isfinite(trial_attrs(t).metrics.get(METRIC, np.nan))]  # ok: spilled ones left out
    card = card_gb(settings)
    oom = [t for t in launched if (trial_attrs(t).status not in ("ok", "stopped") and is_oom(trial_attrs(t).reason))
           or (trial_attrs(t).status in ("ok", "stopped") and spilled(t, card))]
    gone = {t.number for t in oom}
    lp = log_p_fits(X[[r for r, _ in ran]], np.array([p for _, p in ran]), X[[row[t.number] for t in oom]],
                    Xf, card, seed) if ran else None
    return lp, launched if lp is None else [t for t in launched if t.number not in gone]
