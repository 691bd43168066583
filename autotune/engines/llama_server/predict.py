"""llama-server's pre-launch estimate: llama.cpp's own (:func:`predict_llamacpp`), on its flags.

The server's knobs are renamed to the binding's (``ctx_size`` -> ``n_ctx``, ``cache_type_k``
-> ``type_k``, ...); ``n_gpu_layers`` ``auto``/``all`` count as all layers when GPUs are
declared in ``engine.settings.gpus`` and as none otherwise (a CPU build offloads nothing).
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
    return predict_llamacpp(q, settings, variants)
