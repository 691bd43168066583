"""vLLM's pre-launch estimate: weights + one max_model_len of KV within gpu_memory_utilization."""

from __future__ import annotations

import os

from autotune.engines.predict import GIB
from autotune.engines.predict import GPU_OVERHEAD_GB
from autotune.engines.predict import Prediction
from autotune.engines.predict import as_dict
from autotune.engines.predict import decode_bound
from autotune.engines.predict import gpu_table
from autotune.engines.predict import hf_shape
from autotune.engines.predict import kv_gb
from autotune.engines.predict import ram_available_gb
from autotune.engines.predict import ram_bandwidth_gbps
from autotune.engines.predict import verdict


def predict_vllm(p: dict, settings: dict, variants: dict) -> Prediction:
    """vLLM takes gpu_memory_utilization of each GPU; weights + one max_model_len of KV must fit."""
    settings = as_dict(settings)
    var = variants.get(p.get("model")) or {}
    shape = hf_shape(var)
    if shape is None:
        return Prediction()
    dtype = str(p.get("dtype") or "auto")
    wbytes = 4.0 if dtype == "float32" else 2.0
    tp = int(p.get("tensor_parallel_size") or 1)
    weights = shape["n_params"] * (float(var["bpw"]) / 8 if var.get("bpw") else wbytes) / GIB / tp
    kv_bytes = 1.0 if str(p.get("kv_cache_dtype", "auto")).startswith("fp8") else wbytes
    kv = kv_gb(shape, int(p.get("max_model_len") or 4096), kv_bytes) / tp
    need = weights + kv + GPU_OVERHEAD_GB
    if settings.get("device") == "cpu":
        space = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 4)
        return verdict([weights + max(kv, space) + 1.0], [ram_available_gb()], ["RAM"],
                       decode_bound([(weights * GIB, ram_bandwidth_gbps(settings))]))
    gpus = gpu_table(settings)[:tp]
    if not gpus:
        return Prediction()
    util = float(p.get("gpu_memory_utilization") or 0.9)
    have = [util * float(g["memory_gb"]) for g in gpus]
    t = max((weights * GIB / (g["bandwidth_gbps"] * 1e9)) if g.get("bandwidth_gbps") else 0.0 for g in gpus)
    return verdict([need] * len(gpus), have, decode_tps_upper=(1.0 / t if t else None))
