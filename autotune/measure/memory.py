"""Memory before launch (an estimate from GGUF metadata) and while running (peak RSS).

:func:`estimate_llamacpp_mb` reads only the GGUF header (``gguf.GGUFReader`` memory-maps
the file and parses metadata; no tensor data is read) and predicts what a llama.cpp
process will hold resident:

- weights: the file size (llama.cpp maps the file and touches every tensor on CPU);
- KV cache: ``n_layers * n_ctx * n_kv_heads * (key_length * bytes(type_k) +
  value_length * bytes(type_v))``; every layer is counted at the full ``n_ctx`` (what
  llama.cpp allocates for gemma-3's sliding-window layers too, checked on 0.3.36);
- logits: ``n_vocab * 4`` bytes per output row, twice (llama.cpp's output buffer and
  llama-cpp-python's ``scores`` copy); one row, or ``n_ctx`` rows with ``logits_all``;
- a fixed runtime overhead (Python, llama.cpp, activations) of ``RUNTIME_MB``.

llama.cpp also reserves a compute buffer of about ``n_ubatch * n_vocab * 4`` bytes for
the worst-case batch of logits; only the rows a batch really produces become resident, so
it is reported separately as ``compute_reserved_mb`` and is not in ``total_mb``.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

MIB = 1024.0 * 1024.0
RUNTIME_MB = 80.0

# bytes per element of the KV cache types (ggml block size / block bytes)
KV_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
    "iq4_nl": 18 / 32,
}


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    value = f.contents()
    return value


def gguf_shape(model_path: str | Path) -> dict:
    """Architecture numbers the estimate needs, read from a GGUF header."""
    from gguf import GGUFReader

    reader = GGUFReader(str(model_path))
    arch = _field(reader, "general.architecture")
    if not arch:
        raise ValueError(f"{model_path}: no general.architecture in the GGUF metadata")
    n_embd = int(_field(reader, f"{arch}.embedding_length"))
    n_head = int(_field(reader, f"{arch}.attention.head_count", 1))
    n_head_kv = _field(reader, f"{arch}.attention.head_count_kv", n_head)
    if isinstance(n_head_kv, list):  # per-layer counts in some architectures
        n_head_kv = max(n_head_kv)
    head_dim = n_embd // max(n_head, 1)
    n_vocab = _field(reader, f"{arch}.vocab_size")
    if n_vocab is None:
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        n_vocab = len(tokens.data) if tokens is not None else 0
    return {
        "arch": arch,
        "n_layers": int(_field(reader, f"{arch}.block_count")),
        "n_embd": n_embd,
        "n_head": n_head,
        "n_head_kv": int(n_head_kv),
        "key_length": int(_field(reader, f"{arch}.attention.key_length", head_dim)),
        "value_length": int(_field(reader, f"{arch}.attention.value_length", head_dim)),
        "n_vocab": int(n_vocab),
        "n_ctx_train": int(_field(reader, f"{arch}.context_length", 0)),
    }


def kv_cache_mb(shape: dict, n_ctx: int, type_k: str, type_v: str) -> float:
    """Size of the KV cache in MiB for ``n_ctx`` cells of every layer."""
    for name, t in (("type_k", type_k), ("type_v", type_v)):
        if t not in KV_BYTES:
            raise ValueError(f"{name}={t!r}: expected one of {', '.join(KV_BYTES)}")
    per_cell = shape["n_head_kv"] * (
        shape["key_length"] * KV_BYTES[type_k] + shape["value_length"] * KV_BYTES[type_v]
    )
    return shape["n_layers"] * n_ctx * per_cell / MIB


def estimate_llamacpp_mb(
    model_path: str | Path,
    n_ctx: int,
    type_k: str = "f16",
    type_v: str = "f16",
    *,
    n_ubatch: int = 512,
    logits_all: bool = False,
) -> dict:
    """Estimate llama.cpp's resident memory (MiB) before loading the model.

    Args:
        model_path: a GGUF file.
        n_ctx: context cells (0 means the model's training context, as llama.cpp does).
        type_k: KV cache key type (``f16``, ``q8_0``, ...).
        type_v: KV cache value type.
        n_ubatch: physical batch size (sizes the reserved compute buffer).
        logits_all: whether logits are kept for every position (prompt lookup, perplexity).

    Returns:
        ``weights_mb``, ``kv_mb``, ``logits_mb``, ``runtime_mb``, ``total_mb`` (their sum,
        the figure reported as ``mem_estimate_mb``), ``compute_reserved_mb`` (address
        space reserved, mostly not resident) and the architecture numbers used.
    """
    shape = gguf_shape(model_path)
    n_ctx = int(n_ctx) or shape["n_ctx_train"]
    weights = os.path.getsize(model_path) / MIB
    kv = kv_cache_mb(shape, n_ctx, type_k, type_v)
    rows = n_ctx if logits_all else 1
    logits = 2 * rows * shape["n_vocab"] * 4 / MIB
    compute = min(n_ubatch, n_ctx) * shape["n_vocab"] * 4 / MIB
    return {
        "weights_mb": weights,
        "kv_mb": kv,
        "logits_mb": logits,
        "runtime_mb": RUNTIME_MB,
        "total_mb": weights + kv + logits + RUNTIME_MB,
        "compute_reserved_mb": compute,
        **shape,
        "n_ctx": n_ctx,
    }


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux ``ru_maxrss`` is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
