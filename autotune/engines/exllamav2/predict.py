"""ExLlamaV2's pre-launch estimate: weights (bpw) + Q-cache + draft per GPU by gpu_split, and a decode bound.

Reads the model directory's ``config.json`` (or a known shape when the directory is not on
this machine); never loads a model.
"""

from __future__ import annotations

from autotune.engines.exllamav2.plan import gpus_of
from autotune.engines.exllamav2.plan import load_plan
from autotune.engines.predict import EXL2_CACHE_BYTES
from autotune.engines.predict import GIB
from autotune.engines.predict import GPU_OVERHEAD_GB
from autotune.engines.predict import Prediction
from autotune.engines.predict import as_dict
from autotune.engines.predict import fill_auto
from autotune.engines.predict import fill_manual
from autotune.engines.predict import gpu_table
from autotune.engines.predict import hf_shape
from autotune.engines.predict import kv_gb
from autotune.engines.predict import split_decode_bound
from autotune.engines.predict import verdict


def predict_exllamav2(p: dict, settings: dict, variants: dict) -> Prediction:
    """Weights (bpw) + Q-cache at cache_size + draft, laid out by gpu_split, per GPU."""
    settings = as_dict(settings)
    var = variants.get(p.get("model")) or {}
    shape = hf_shape(var)
    gpus = gpu_table({"gpus": gpus_of(settings)} if gpus_of(settings) else settings)
    if shape is None or not var.get("bpw") or not gpus:
        return Prediction()
    plan = load_plan(p, settings)
    weights = shape["n_params"] * float(var["bpw"]) / 8 / GIB
    cache = kv_gb(shape, plan["cache_size"], EXL2_CACHE_BYTES[p["cache_mode"]])
    draft_gb, draft_bytes, k = 0.0, 0.0, 0
    if plan["draft"]:
        dvar = variants.get(plan["draft"]["variant"]) or {}
        dshape = hf_shape(dvar)
        if dshape is None:
            return Prediction()
        draft_bytes = dshape["n_params"] * float(dvar.get("bpw") or 16) / 8
        draft_gb = draft_bytes / GIB + kv_gb(dshape, plan["cache_size"],
                                              EXL2_CACHE_BYTES[p.get("draft_cache_mode", "FP16")])
        k = int(plan["generator"]["num_draft_tokens"])
    mem = [float(g["memory_gb"]) for g in gpus]
    reserve = [r / GIB for r in plan["reserve_vram"]] + [0.0] * len(gpus)
    need = [GPU_OVERHEAD_GB + reserve[i] for i in range(len(gpus))]
    need[0] += draft_gb  # the draft loads first, on the first GPU
    model = weights + cache
    if plan["mode"] == "tp":
        share = [m / sum(mem) for m in mem]
    elif plan["mode"] == "manual":
        split = (plan["gpu_split"] + [0.0] * len(gpus))[: len(gpus)]
        if weights > sum(split):
            return Prediction(False, f"predicted OOM: {weights:.1f} GB of weights do not fit "
                              f"gpu_split {plan['gpu_split']} ({sum(split):g} GB)", (weights,),
                              (sum(split),))
        share = fill_manual(split, weights)
    else:
        share = fill_auto(model, [m - n for m, n in zip(mem, need)])
    need = [n + model * s for n, s in zip(need, share)]
    bws = [g.get("bandwidth_gbps") for g in gpus]
    target = split_decode_bound(weights, share, bws, plan["mode"] == "tp")
    upper = target
    if target and k:
        draft_t = draft_bytes / ((bws[0] or 1) * 1e9)
        upper = (k + 1) / (k * draft_t + 1.0 / target)
    return verdict(need, mem, decode_tps_upper=upper)
