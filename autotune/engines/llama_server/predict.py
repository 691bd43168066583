"""llama-server's pre-launch estimate: llama.cpp's own (:func:`predict_llamacpp`), on its flags.

The server's knobs are renamed to the binding's (``ctx_size`` -> ``n_ctx``, ``cache_type_k``
-> ``type_k``, ...); ``n_gpu_layers`` ``auto``/``all`` count as all layers when GPUs are
declared in ``engine.settings.gpus`` and as none otherwise (a CPU build offloads nothing).
The KV cache is sized as the server allocates it: ``--parallel`` slots (-1: 4 in one unified
cache), ``--kv-unified``, and sliding-window layers holding a window, not the context, unless
``--swa-full`` (:func:`~autotune.engines.llamacpp.gguf_memory.kv_cells`).
"""

from __future__ import annotations

from autotune.engines.llamacpp.predict import predict_llamacpp
from autotune.engines.predict import Prediction

RENAMES = {"ctx_size": "n_ctx", "cache_type_k": "type_k", "cache_type_v": "type_v",
           "ubatch_size": "n_ubatch", "batch_size": "n_batch", "threads": "n_threads",
           "split_mode": "split_mode"}


def gpu_layers(value, settings: dict) -> int:
    """``-ngl`` as a number: auto/all = every layer (-1) with declared GPUs, else 0."""
    if isinstance(value, str) and value in ("auto", "all"):
        gpus = settings.get("gpus") if isinstance(settings, dict) else getattr(settings, "gpus", None)
        return -1 if gpus else 0
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def predict_llama_server(p: dict, settings: dict, variants: dict) -> Prediction:
    """Memory and decode bound of a llama-server configuration (see the module docstring)."""
    q = {RENAMES.get(k, k): v for k, v in p.items()}
    q["n_gpu_layers"] = gpu_layers(p.get("n_gpu_layers"), settings)
    q["draft"] = "none"
    return predict_llamacpp({**q, **slot_knobs(p)}, settings, variants)


def slot_knobs(p: dict) -> dict:
    """How the server lays out its KV cache for knobs ``p``: ``n_seq`` slots (``--parallel``;
    -1 is 4), ``kv_unified`` (``--kv-unified``; by default on exactly when ``--parallel`` is
    -1), ``swa_full`` (``--swa-full``, off by default) and ``fit`` (``--fit``: on by default,
    when it gives each slot the training context for ``--ctx-size 0``)."""
    slots = int(p["parallel"]) if p.get("parallel") is not None else -1
    return {"n_seq": 4 if slots < 0 else max(slots, 1),
            "kv_unified": bool(p["kv_unified"]) if p.get("kv_unified") is not None else slots < 0,
            "swa_full": bool(p.get("swa_full", False)), "fit": p.get("fit", "on")}
