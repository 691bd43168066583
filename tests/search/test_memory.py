"""Memory as a learned constraint (issue 41): autotune.search.memory and its hook in bo.

The reason text tells an out-of-memory failure from others; the model predicts whether an
untried configuration fits the declared card from a few measured peaks, the out-of-memory
launches entering as censored observations; then ``bo`` on a real Optuna study told through
:func:`autotune.record.optuna_study.tell` (the driver's path): a MoE-like space where the least
offload that fits moves with the quant.
"""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from autotune.config.schema import load_config
from autotune.search import memory
from autotune.trial.spec import TrialResult

CARD = 24.0
SIZE = {"q4": 17.0, "q5": 20.0, "q6": 23.0, "q8": 30.0}  # GB of weights per quant


def test_the_reason_text_tells_out_of_memory_from_other_failures():
    assert memory.is_oom("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 27.3 GiB on device 0: "
                         "cudaMalloc failed: out of memory")
    assert memory.is_oom("torch.OutOfMemoryError: CUDA out of memory while capturing CUDA graphs")
    assert not memory.is_oom("llama_decode: failed to find a KV slot: n_ctx=4096 < 4512")
    assert not memory.is_oom("ValueError: No available memory for the cache blocks.")
    assert not memory.is_oom(None)


def test_an_out_of_memory_line_says_what_the_launch_needed_at_least():
    # ggml-cuda names the one buffer it failed to allocate (ggml-cuda.cu's GGML_LOG_ERROR line)
    assert memory.oom_need_gb("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 31027.20 MiB on "
                              "device 0: cudaMalloc failed: out of memory") == pytest.approx(30.3, abs=0.01)
    # PyTorch: what the process held (total less free) and the request that failed
    assert memory.oom_need_gb("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
                              "has a total capacity of 79.19 GiB of which 1.06 GiB is free.") == pytest.approx(80.13)
    assert memory.oom_need_gb("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 "
                              "has a total capacity of 23.99 GiB of which 100.00 MiB is free.") == pytest.approx(24.39, abs=0.01)
    assert memory.oom_need_gb("torch.OutOfMemoryError: CUDA out of memory while capturing CUDA graphs") is None
    assert memory.oom_need_gb(None) is None


def test_what_an_out_of_memory_line_says_carries_the_model_past_the_card():
    """Peak = 4 + 22 a (card 20): two runs at a <= 0.5 and one launch at a = 1 that ran out of
    memory. Entered at the card, the failure is barely over it and a = 0.8 looks likely to fit;
    entered at the 26 GB its line named, the trend puts a = 0.8 (21.6 GB) past the card."""
    X_ran, peaks = np.array([[0.0], [0.5]]), np.array([4.0, 15.0])
    X_oom, Xc = np.array([[1.0]]), np.array([[0.8], [0.2]])
    at_card = np.exp(memory.log_p_fits(X_ran, peaks, X_oom, Xc, 20.0, seed=0))
    said = np.exp(memory.log_p_fits(X_ran, peaks, X_oom, Xc, 20.0, seed=0, need=np.array([26.0])))
    assert said[0] < at_card[0] and said[0] < 0.2, (said, at_card)
    assert said[1] > 0.9  # 8.4 GB: fits either way


def test_the_card_is_what_the_settings_declare():
    assert memory.card_gb({"gpus": [{"name": "RTX 4090", "memory_gb": 24}]}) == 24.0
    assert memory.card_gb({"gpus": [{"memory_gb": 32}, {"memory_gb": 24}]}) == 56.0
    assert memory.card_gb({"gpus": []}) is None
    assert memory.card_gb({}) is None


def test_a_few_peaks_and_a_censored_failure_place_the_edge():
    """Peak = 4 + 12 a + 8 b (c costs nothing), card 20: from six runs and two launches that
    ran out of memory, a configuration that needs 9 GB fits, one that needs 22 or 24 does not, and
    the knob that costs nothing does not move the answer."""
    rng = np.random.default_rng(0)
    X_ran = np.array([[0, 0, 0], [0.5, 0, 1], [0, 1, 0.5], [1, 0, 0], [0.25, 0.5, 1], [0.5, 0.5, 0]], dtype=float)
    peaks = 4 + 12 * X_ran[:, 0] + 8 * X_ran[:, 1] + rng.normal(0, 0.05, len(X_ran))
    X_oom = np.array([[1, 1, 0], [1, 0.75, 1]], dtype=float)
    Xc = np.array([[0.25, 0.25, 0.0], [0.25, 0.25, 1.0], [1.0, 0.75, 0.5], [1.0, 1.0, 1.0]])
    lp = memory.log_p_fits(X_ran, peaks, X_oom, Xc, CARD - 4, seed=0)
    p = np.exp(lp)
    assert p[0] > 0.9 and p[1] > 0.9, p  # 9 GB, whatever c
    assert p[2] < 0.05 and p[3] < 0.05, p  # 22 and 24 GB, next to the failures, whatever c
    assert memory.log_p_fits(X_ran, peaks, X_oom, Xc, None, seed=0) is None  # no card declared: no model


def test_a_run_at_the_cards_limit_counts_as_a_spill_only_when_asked(monkeypatch):
    trial = optuna.trial.create_trial(values=[5.0], user_attrs={"status": "ok", "metrics": {"vram_peak_gb": 23.9}})
    monkeypatch.setattr(memory, "MEMORY", True)
    monkeypatch.setattr(memory, "FULL", None)
    assert not memory.spilled(trial, CARD)  # FULL None: off
    monkeypatch.setattr(memory, "FULL", 0.99)
    assert memory.spilled(trial, CARD)
    assert not memory.spilled(trial, None)


def test_a_spill_fills_what_was_free_at_the_start_not_the_whole_card(monkeypatch):
    """Other processes held 0.7 GB of the 24: a trial that filled the 23.3 GB left spilled, though
    its peak reads below 99% of the card."""
    monkeypatch.setattr(memory, "MEMORY", True)
    monkeypatch.setattr(memory, "FULL", 0.99)
    full = optuna.trial.create_trial(values=[5.0], user_attrs={
        "status": "ok", "metrics": {"vram_peak_gb": 23.3, "vram_free_gb": 23.3}})
    below = optuna.trial.create_trial(values=[5.0], user_attrs={
        "status": "ok", "metrics": {"vram_peak_gb": 21.0, "vram_free_gb": 23.3}})
    assert memory.spilled(full, CARD) and not memory.spilled(below, CARD)
    monkeypatch.setattr(memory, "FREE_AT_START", False)
    assert not memory.spilled(full, CARD)  # against the card alone it looks fine


def _config():
    return load_config({
        "engine": {"kind": "command", "settings": {
            "argv": ["x", "{quant}"],
            "knobs": {"quant": {"type": "str", "choices": list(SIZE)},
                      "offload": {"type": "int", "low": 0, "high": 48},
                      "threads": {"type": "int", "low": 1, "high": 16}},
            "defaults": {"quant": "q4", "offload": 48, "threads": 8},
            "gpus": [{"name": "RTX 4090", "memory_gb": CARD}]}},
        "space": {"quant": {"type": "categorical", "choices": list(SIZE), "ordered": True},
                  "offload": {"type": "int", "low": 0, "high": 48, "step": 4},
                  "threads": {"type": "categorical", "choices": [4, 8, 12, 16]}},
        "objectives": ["decode_tps"],
        "quality": {"enabled": False},
    })


def _run(p: dict, number: int) -> TrialResult:
    """A layer's experts on the GPU cost SIZE/48; decode speeds up as fewer stay in RAM and with
    a heavier quant (a better model is the user's choice here: speed x quality)."""
    peak = 1.0 + SIZE[p["quant"]] * (48 - p["offload"]) / 48
    if peak > CARD:
        return TrialResult(number, "failed", reason="cudaMalloc failed: out of memory")
    tps = 10.0 + 2.0 * (48 - p["offload"]) + 3.0 * list(SIZE).index(p["quant"]) + 0.1 * p["threads"]
    return TrialResult(number, "ok", {"decode_tps": tps, "vram_peak_gb": peak})


def _ooms(seed: int, bo_run) -> int:
    start = [{"quant": "q4", "offload": 48, "threads": 8}, {"quant": "q8", "offload": 8, "threads": 4},
             {"quant": "q5", "offload": 24, "threads": 16}, {"quant": "q6", "offload": 36, "threads": 12}]
    return sum(r.status == "failed" for _, r in bo_run(_config(), _run, start, seed))


@pytest.mark.parametrize("seed", [0, 1])
def test_bo_with_the_memory_model_runs_out_of_memory_less(monkeypatch, seed, bo_run):
    """The startup's one out-of-memory launch (q8 at offload 8) and three peaks: with the memory
    model bo's later asks run out of memory less often than with a GP of "does it run" alone."""
    monkeypatch.setattr(memory, "AFTER_OOM", False)  # the model itself, from the first peaks on
    monkeypatch.setattr(memory, "FULL", None)
    monkeypatch.setattr(memory, "MEMORY", False)
    without = _ooms(seed, bo_run)
    monkeypatch.setattr(memory, "MEMORY", True)
    with_model = _ooms(seed, bo_run)
    assert with_model < without, (with_model, without)
