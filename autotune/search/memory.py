"""Memory as a learned constraint (issue 41): whether a configuration fits the card, from a few
measured peaks instead of a crash per region.

Every launch that ran reports its peak GPU memory (``vram_peak_gb``); one that ran out of memory
says so in its reason (``cudaMalloc failed: out of memory``, ``torch.OutOfMemoryError``). Memory is
nearly additive over the knobs (weights on the GPU, the KV cache, the buffers), so a GP with a
linear part (scikit-learn's ``DotProduct`` plus a Matern 5/2, fitted noise) over the pool's
features predicts it for a configuration never launched, e.g. a heavier quant at more offload.
An out-of-memory launch is a censored observation: it needed more than the card holds, and at
least what its line names (:func:`oom_need_gb`: ggml-cuda's failed buffer, PyTorch's request plus
what the process held), so it enters the fit at ``max(card, that, its prediction)`` (two rounds,
a Tobit-like imputation). Entered at the card alone, a Q8_0 launch that needed 30 GB of a 24 GB
card reads as one just over it, and the model then expects a smaller KV cache or batch to make
it fit (a trace of bench/surfaces moe_30b, report seed 109: eight launches out of memory at the
same quant and offload). The card's memory is what the user declared (``engine.settings.gpus``'
``memory_gb``, summed over the trial's cards), less what other processes held when the trials
started where the engine measures it (``vram_free_gb``: a trial's peak is read above that idle
reading, so a spill fills what was free, not the card); without a declared card there is no
memory model (a launch that ran out of memory counts as any other failure).

:func:`log_p_fits` gives log P(peak <= card) per candidate. bo multiplies it into P(feasible) and
its GP of "does it run" then learns only from the other failures (a context shorter than the
prompt, a crash), which memory does not explain. On by default where a card is declared, from the
first launch that ran out of memory (AFTER_OOM), a run at 99% of the card or more counted as out
of memory (FULL): the bench's variant memoomfull, chosen on tune instances (moe_30b 8/18 at 95% by
trial 20 against 5/18, median 0.867 against 0.609), judged on held-out instances (17/48 -> 20/48
over moe, vllm, llamacpp_7b and noisy in three prior modes; llamacpp_7b 5/6 against 6/6) and on the
hand-written surfaces' report seeds 100-119 (vllm_h100 physics 18/20 against 11/20, moe_30b
physics 18/20 against 15/20, 3 studies lost and 19 won of 240 paired; bench/results/efficiency.txt,
session 23). ``MEMORY = False`` turns it off. The failure's named size (OOM_SIZE) and the spill
judged against what was free (FREE_AT_START) came in session 24: on the MoE family's held-out
instances 5000-5005, 8 of 18 studies at 95% of the optimum by trial 20 against 4 (median best
without a prior 0.891 against 0.694), on its tune instances 18 of 30 against 15, on the MoE
surface's report seeds without a prior 15 of 20 against 10 (bench/results/efficiency.txt).
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np
from scipy.stats import norm

MEMORY = True
METRIC = "vram_peak_gb"
FREE = "vram_free_gb"  # what the trial's GPUs had free at its start (autotune.hardware.VramSampler)
FREE_AT_START = True
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


# What an out-of-memory line says the launch needed at least, in GB (OOM_SIZE): ggml-cuda names
# the one buffer it failed to allocate ("allocating 31027.20 MiB on device 0: cudaMalloc failed");
# PyTorch the request and what the process held ("Tried to allocate 2.00 GiB. GPU 0 has a total
# capacity of 79.19 GiB of which 1.06 GiB is free").
OOM_SIZE = True
_UNIT = {"kib": 1 / 1024 ** 2, "mib": 1 / 1024, "gib": 1.0}  # the units the two lines print
_GGML = re.compile(r"allocating ([0-9.]+) (MiB|GiB) on device", re.I)
_TORCH = re.compile(r"tried to allocate ([0-9.]+) (MiB|GiB|KiB).*?total capacity of ([0-9.]+) (GiB|MiB)"
                    r" of which ([0-9.]+) (GiB|MiB|KiB) is free", re.I | re.S)


def oom_need_gb(reason: str | None) -> float | None:
    """The least the failed launch needed, read from its out-of-memory line (None: not said)."""
    text = reason or ""
    m = _TORCH.search(text)
    if m:
        want, cap, free = (float(m[i]) * _UNIT[m[i + 1].lower()] for i in (1, 3, 5))
        return cap - free + want
    m = _GGML.search(text)
    return float(m[1]) * _UNIT[m[2].lower()] if m else None


def is_oom(reason: str | None) -> bool:
    """Whether a failed launch's reason reads as running out of GPU memory."""
    text = (reason or "").lower()
    return any(m in text for m in OOM_MARKERS)


def spilled(t: Any, card: float | None) -> bool:
    """Whether a trial that ran sat at the card's limit (see FULL): its peak at FULL of what its
    GPUs had free when it started (``vram_free_gb``, where measured; other processes' memory
    is not the trial's to use) or of the declared card."""
    from autotune.search.trials import trial_attrs

    metrics = trial_attrs(t).metrics
    peak = metrics.get(METRIC) if FULL and card and MEMORY else None
    if peak is None:
        return False
    free = metrics.get(FREE) if FREE_AT_START else None
    limit = min(card, float(free)) if free is not None and float(free) > 0 else card
    return float(peak) >= FULL * limit


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
               card: float | None, seed: int, need: np.ndarray | None = None) -> np.ndarray | None:
    """log P(peak <= the card) for each row of ``Xc``, from the peaks (GB) measured at ``X_ran``
    and the out-of-memory launches at ``X_oom`` (None: too little to go on); ``need``: what each
    of those said it needed at least (NaN: nothing said)."""
    if not card or len(peaks) < 2 or (not len(X_oom) and (AFTER_OOM or len(peaks) < MIN_RUNS)):
        return None
    limit = float(card)
    floor = np.full(len(X_oom), limit) if need is None else np.fmax(limit, np.asarray(need, dtype=float))
    X = np.vstack([X_ran, X_oom]) if len(X_oom) else X_ran
    y = np.concatenate([peaks, floor])
    gp = _gp(X, y, seed)
    if len(X_oom):  # censored: each failed launch needed more than the card, at least its prediction
        y[len(peaks):] = np.maximum(floor, gp.predict(X_oom)) + PAD * limit
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
    free = [float(trial_attrs(t).metrics[FREE]) for t in launched if FREE_AT_START and card
            and float(trial_attrs(t).metrics.get(FREE) or 0.0) > 0]
    usable = min(card, float(np.median(free))) if free else card  # what a trial may fill
    oom = [t for t in launched if (trial_attrs(t).status not in ("ok", "stopped") and is_oom(trial_attrs(t).reason))
           or (trial_attrs(t).status in ("ok", "stopped") and spilled(t, card))]
    gone = {t.number for t in oom}
    need = np.array([(oom_need_gb(trial_attrs(t).reason) if OOM_SIZE else None) or np.nan for t in oom])
    lp = log_p_fits(X[[r for r, _ in ran]], np.array([p for _, p in ran]), X[[row[t.number] for t in oom]],
                    Xf, usable, seed, need) if ran else None
    return lp, launched if lp is None else [t for t in launched if t.number not in gone]
