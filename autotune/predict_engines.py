"""The built-in engines' pre-launch estimates: llama.cpp, ExLlamaV2, vLLM (see autotune.predict).

Each function takes the engine's *full* parameters (defaults, fixed settings and the
trial's values merged) and returns a :class:`~autotune.predict.Prediction`. None of them
loads a model: llama.cpp reads the GGUF header, ExLlamaV2 and vLLM read the model
directory's ``config.json`` (or a known shape when the directory is not on this machine).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from autotune.engines.exl2_plan import gpus_of
from autotune.engines.exl2_plan import load_plan
from autotune.measure.memory import MIB
from autotune.measure.memory import estimate_llamacpp_mb
from autotune.predict import EXL2_CACHE_BYTES
from autotune.predict import GIB
from autotune.predict import GPU_OVERHEAD_GB
from autotune.predict import KNOWN_SHAPES
from autotune.predict import Prediction
from autotune.predict import as_dict
from autotune.predict import decode_bound
from autotune.predict import gpu_table
from autotune.predict import ram_available_gb
from autotune.predict import ram_bandwidth_gbps
from autotune.predict import verdict

# approximate bits per weight of llama.cpp file types, to size a variant not yet made
FTYPE_BPW = {0: 32.0, 1: 16.0, 2: 4.5, 3: 5.0, 7: 8.5, 8: 5.5, 9: 6.0, 10: 3.35, 11: 3.5,
             12: 3.9, 13: 4.3, 14: 4.6, 15: 4.85, 16: 5.5, 17: 5.7, 18: 6.56, 25: 4.5, 30: 4.25}


def gguf_file(name: str, variants: dict) -> tuple[Path | None, float]:
    """A variant's GGUF file without making it, and a size factor (1.0 when exact).

    A recipe variant not made yet is sized from its base file, scaled by bits per weight.
    """
    from autotune.models import QUANT_TYPES
    from autotune.models import made_variant_file
    from autotune.models import quantized_file

    v = variants.get(name) or {}
    if "recipe" not in v:
        return made_variant_file(name, variants), 1.0
    base, _ = gguf_file(v.get("base", ""), variants)
    if base is None:
        return None, 1.0
    made = quantized_file(base, v["recipe"])
    if made.exists():
        return made, 1.0
    from autotune.measure.memory import read_gguf_metadata

    base_ft = int(read_gguf_metadata(base).get("general.file_type", 15))
    want = FTYPE_BPW.get(QUANT_TYPES[v["recipe"]["ftype"]][0], 4.85)
    return base, want / FTYPE_BPW.get(base_ft, 4.85)


def predict_llamacpp(p: dict, settings: dict, variants: dict) -> Prediction:
    """RAM (CPU part) and VRAM per GPU (offloaded layers, KV, compute buffer) + decode bound."""
    settings = as_dict(settings)
    path, factor = gguf_file(p.get("model", ""), variants)
    if path is None or not path.exists():
        return Prediction()
    est = estimate_llamacpp_mb(path, int(p.get("n_ctx") or 0), p.get("type_k", "f16"),
                               p.get("type_v", "f16"), n_ubatch=int(p.get("n_ubatch") or 512),
                               logits_all=p.get("draft", "none") != "none")
    weights = est["weights_mb"] * factor * MIB / GIB
    kv = est["kv_mb"] * MIB / GIB
    n_layers = est["n_layers"]
    ngl = int(p.get("n_gpu_layers") or 0)
    on_gpu = 1.0 if ngl < 0 else min(ngl, n_layers + 1) / (n_layers + 1)
    cpu_need = weights * (1 - on_gpu) + (kv if ngl == 0 or not p.get("offload_kqv", True) else 0.0)
    cpu_need += (est["logits_mb"] + est["runtime_mb"]) * MIB / GIB
    cpu_bw = ram_bandwidth_gbps(settings)
    if not ngl:
        upper = decode_bound([(weights * GIB, cpu_bw)])
        return verdict([cpu_need], [ram_available_gb()], ["RAM"], upper)
    gpus = gpu_table(settings)
    if not gpus:
        return Prediction(reason="n_gpu_layers > 0 but no GPU is known (engine.settings.gpus)")
    split = [float(x) for x in p.get("tensor_split") or []] or [1.0]
    if p.get("split_mode") == "none":
        split = [1.0 if i == int(p.get("main_gpu") or 0) else 0.0 for i in range(len(gpus))]
    split = (split + [0.0] * len(gpus))[: len(gpus)]
    total = sum(split) or 1.0
    gpu_kv = kv * on_gpu if p.get("offload_kqv", True) else 0.0
    compute = est["compute_reserved_mb"] * MIB / GIB
    need = [(weights * on_gpu + gpu_kv) * s / total + (GPU_OVERHEAD_GB + compute if s else 0.0)
            for s in split]
    parts = [(weights * (1 - on_gpu) * GIB, cpu_bw)]
    parts += [(weights * on_gpu * s / total * GIB, g.get("bandwidth_gbps")) for s, g in zip(split, gpus)]
    labels = ["RAM"] + [f"GPU {i}" for i in range(len(gpus))]
    return verdict([cpu_need] + need, [ram_available_gb()] + [float(g["memory_gb"]) for g in gpus],
                   labels, decode_bound(parts))


def hf_shape(variant: dict) -> dict | None:
    """n_params, n_layers, n_kv_heads, head_dim, hidden of a model directory (or a known shape)."""
    path = Path(os.path.expanduser(str(variant.get("path", ""))))
    cfg_path = path / "config.json"
    if cfg_path.is_file():
        c = json.loads(cfg_path.read_text())
        hidden, layers = int(c["hidden_size"]), int(c["num_hidden_layers"])
        heads = int(c.get("num_attention_heads", 1))
        head_dim = int(c.get("head_dim") or hidden // heads)
        inter, vocab = int(c.get("intermediate_size", 4 * hidden)), int(c.get("vocab_size", 32000))
        kv_heads = int(c.get("num_key_value_heads", heads))
        per_layer = hidden * (heads * head_dim * 2 + kv_heads * head_dim * 2) + 3 * hidden * inter
        tied = c.get("tie_word_embeddings", False)
        n = layers * per_layer + vocab * hidden * (1 if tied else 2)
        return {"n_params": float(n), "n_layers": layers, "n_kv_heads": kv_heads,
                "head_dim": head_dim, "hidden": hidden}
    name = path.name.lower()
    for key, shape in KNOWN_SHAPES.items():
        if f"-{key}" in name or f"_{key}" in name or name.startswith(key):
            return shape
    return None


def _kv_gb(shape: dict, tokens: int, bytes_per_elem: float) -> float:
    return 2 * shape["n_layers"] * shape["n_kv_heads"] * shape["head_dim"] * tokens * bytes_per_elem / GIB


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
    cache = _kv_gb(shape, plan["cache_size"], EXL2_CACHE_BYTES[p["cache_mode"]])
    draft_gb, draft_bytes, k = 0.0, 0.0, 0
    if plan["draft"]:
        dvar = variants.get(plan["draft"]["variant"]) or {}
        dshape = hf_shape(dvar)
        if dshape is None:
            return Prediction()
        draft_bytes = dshape["n_params"] * float(dvar.get("bpw") or 16) / 8
        draft_gb = draft_bytes / GIB + _kv_gb(dshape, plan["cache_size"],
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
        left, share = 1.0, []  # fill GPU 0 up to its split, then the next
        for s in split:
            take = min(left, s / weights)
            share.append(take)
            left -= take
    else:  # auto: fill each GPU in order up to what is free
        left, share = model, []
        for i, m in enumerate(mem):
            take = max(0.0, min(left, m - need[i]))
            share.append(take / model)
            left -= take
        share[-1] += left / model
    need = [n + model * s for n, s in zip(need, share)]
    bws = [g.get("bandwidth_gbps") for g in gpus]
    if plan["mode"] == "tp":
        t = max((weights * GIB * s / (bw * 1e9) if bw else float("inf")) for s, bw in zip(share, bws))
        target = 1.0 / t if t and t != float("inf") else None
    else:
        target = decode_bound([(weights * GIB * s, bw) for s, bw in zip(share, bws)])
    upper = target
    if target and k:
        draft_t = draft_bytes / ((bws[0] or 1) * 1e9)
        upper = (k + 1) / (k * draft_t + 1.0 / target)
    return verdict(need, mem, decode_tps_upper=upper)


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
    kv = _kv_gb(shape, int(p.get("max_model_len") or 4096), kv_bytes) / tp
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
