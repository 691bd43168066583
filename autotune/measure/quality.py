"""Quality against a reference configuration: perplexity, its delta, and KL divergence.

The reference (by default the highest-precision variant with an f16 KV cache and no
speculation) is evaluated once per study; its next-token log-probabilities are cached as
float16 ``.npy`` files and every trial is compared with them on the same tokens.
KLD(ref || trial) per position catches damage that perplexity averages away.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from autotune.measure.types import Generator

if TYPE_CHECKING:
    from autotune.measure.spec import QualitySpec

CHUNK_ROWS = 64
# what quality_metrics returns (with a reference: compare), the numbers a trial may reuse
QUALITY_METRICS = ("ppl", "ppl_delta", "ppl_delta_pct", "kld_mean", "kld_p99", "same_top_pct")


def load_text(name: str) -> str:
    """A shipped quality text by name (``gpl3``) or a path to a text file."""
    path = Path(name)
    if not path.suffix:
        path = Path(str(resources.files("autotune") / "data" / "quality" / f"{name}.txt"))
    return path.read_text()


def log_softmax(rows: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float32 (numerically stable)."""
    rows = np.asarray(rows, dtype=np.float32)
    m = rows.max(axis=1, keepdims=True)
    z = rows - m
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def iter_logprobs(logits: np.ndarray):
    """Yield (start, log-softmax chunk) over the rows that predict a next token."""
    n = logits.shape[0] - 1
    for s in range(0, n, CHUNK_ROWS):
        yield s, log_softmax(logits[s : min(s + CHUNK_ROWS, n)])


def perplexity(tokens: list[int], logits: np.ndarray) -> float:
    """exp(mean NLL) of tokens[1:] given the logits rows (row i predicts token i+1)."""
    nll = 0.0
    for s, lp in iter_logprobs(logits):
        nxt = np.asarray(tokens[s + 1 : s + 1 + lp.shape[0]])
        nll -= float(lp[np.arange(lp.shape[0]), nxt].sum())
    return math.exp(nll / (len(tokens) - 1))


def save_reference(ref_dir: Path, tokens: list[int], logits: np.ndarray) -> dict:
    """Cache the reference's tokens, float16 log-probs and perplexity under ``ref_dir``."""
    ref_dir.mkdir(parents=True, exist_ok=True)
    n = logits.shape[0] - 1
    out = np.lib.format.open_memmap(
        ref_dir / "logprobs.tmp.npy", mode="w+", dtype=np.float16, shape=(n, logits.shape[1])
    )
    for s, lp in iter_logprobs(logits):
        out[s : s + lp.shape[0]] = lp.astype(np.float16)
    out.flush()
    del out
    np.save(ref_dir / "tokens.npy", np.asarray(tokens, dtype=np.int64))
    (ref_dir / "logprobs.tmp.npy").replace(ref_dir / "logprobs.npy")
    meta = {"ppl": perplexity(tokens, logits), "n_tokens": len(tokens)}
    (ref_dir / "meta.json").write_text(json.dumps(meta))
    return meta


def reference_ready(ref_dir: Path) -> bool:
    return (Path(ref_dir) / "meta.json").exists() and (Path(ref_dir) / "logprobs.npy").exists()


def compare(tokens: list[int], logits: np.ndarray, ref_dir: Path) -> dict[str, float]:
    """Perplexity and KLD of a trial vs the cached reference on the same tokens."""
    ref_dir = Path(ref_dir)
    meta = json.loads((ref_dir / "meta.json").read_text())
    ref_tokens = np.load(ref_dir / "tokens.npy").tolist()
    if ref_tokens != list(tokens):
        raise RuntimeError("trial tokenised the quality text differently from the reference")
    ref = np.load(ref_dir / "logprobs.npy", mmap_mode="r")
    ppl = perplexity(tokens, logits)
    klds, same = [], 0
    for s, lp in iter_logprobs(logits):
        rp = np.asarray(ref[s : s + lp.shape[0]], dtype=np.float32)
        p = np.exp(rp)
        klds.append(np.maximum((p * (rp - lp)).sum(axis=1), 0.0))
        same += int((rp.argmax(axis=1) == lp.argmax(axis=1)).sum())
    kld = np.concatenate(klds)
    ref_ppl = meta["ppl"]
    return {
        "ppl": ppl,
        "ppl_delta": ppl - ref_ppl,
        "ppl_delta_pct": 100.0 * (ppl - ref_ppl) / ref_ppl,
        "kld_mean": float(kld.mean()),
        "kld_p99": float(np.percentile(kld, 99)),
        "same_top_pct": 100.0 * same / kld.size,
    }


def quality_metrics(engine: Generator, quality: QualitySpec) -> dict[str, float]:
    """Evaluate the trial's engine on the quality text (vs the reference when given)."""
    tokens, logits = engine.logprobs(load_text(quality.text), int(quality.n_tokens))
    ref_dir = quality.reference_dir
    if ref_dir and reference_ready(Path(ref_dir)):
        return compare(tokens, logits, Path(ref_dir))
    return {"ppl": perplexity(tokens, logits)}
