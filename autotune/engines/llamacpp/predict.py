"""llama.cpp's pre-launch estimate: RAM and VRAM per GPU from the GGUF header, and a decode bound.

A model with experts is sized from its tensor table instead (:func:`predict_placed`).

The function takes the engine's *full* parameters (defaults, fixed settings and the trial's
values merged) and returns a :class:`~autotune.engines.predict.Prediction` without loading a model.
"""

from __future__ import annotations

from pathlib import Path

from autotune.engines.llamacpp.gguf_memory import MIB
from autotune.engines.llamacpp.gguf_memory import estimate_llamacpp_mb
from autotune.engines.llamacpp.gguf_memory import gguf_shape
from autotune.engines.llamacpp.gguf_memory import kv_type_refusal
from autotune.engines.llamacpp.moe import layer_table
from autotune.engines.llamacpp.moe import parse_split
from autotune.engines.llamacpp.moe import place
from autotune.engines.predict import GIB
from autotune.engines.predict import GPU_OVERHEAD_GB
from autotune.engines.predict import Prediction
from autotune.engines.predict import as_dict
from autotune.engines.predict import decode_bound
from autotune.engines.predict import gpu_table
from autotune.engines.predict import ram_available_gb
from autotune.engines.predict import ram_bandwidth_gbps
from autotune.engines.predict import ram_bandwidth_source
from autotune.engines.predict import verdict
from autotune.engines.roofline import DeviceRead

# approximate bits per weight of llama.cpp file types, to size a variant not yet made
FTYPE_BPW = {0: 32.0, 1: 16.0, 2: 4.5, 3: 5.0, 7: 8.5, 8: 5.5, 9: 6.0, 10: 3.35, 11: 3.5,
             12: 3.9, 13: 4.3, 14: 4.6, 15: 4.85, 16: 5.5, 17: 5.7, 18: 6.56, 25: 4.5, 30: 4.25}


def gguf_file(name: str, variants: dict) -> tuple[Path | None, float]:
    """A variant's GGUF file without making it, and a size factor (1.0 when exact).

    A recipe variant not made yet is sized from its base file, scaled by bits per weight.
    """
    from autotune.engines.variants import QUANT_TYPES
    from autotune.engines.variants import made_variant_file
    from autotune.engines.variants import quantized_file

    v = variants.get(name) or {}
    if "recipe" not in v:
        return made_variant_file(name, variants), 1.0
    base, _ = gguf_file(v.get("base", ""), variants)
    if base is None:
        return None, 1.0
    made = quantized_file(base, v["recipe"])
    if made.exists():
        return made, 1.0
    from autotune.engines.llamacpp.gguf_memory import gguf_metadata

    base_ft = int(gguf_metadata(base).get("general.file_type", 15))
    want = FTYPE_BPW.get(QUANT_TYPES[v["recipe"]["ftype"]][0], 4.85)
    return base, want / FTYPE_BPW.get(base_ft, 4.85)


def kv_layout(p: dict) -> dict:
    """The KV cache's sequences, sharing, sliding-window size and share of the training context
    (``n_seq``, ``unified``, ``swa_full``, ``ctx_each``) where the caller set them (llama-server's
    slots and ``--fit``); llama-cpp-python's one full-size sequence otherwise (:func:`~autotune.engines.llamacpp.gguf_memory.kv_cells`)."""
    return {"n_seq": int(p.get("n_seq") or 1), "unified": bool(p.get("kv_unified", True)),
            "swa_full": bool(p.get("swa_full", True)), "ctx_each": p.get("fit", "on") != "off"}


def predict_llamacpp(p: dict, settings: dict, variants: dict) -> Prediction:
    """RAM (CPU part) and VRAM per GPU (offloaded layers, KV, compute buffer) + decode bound."""
    settings = as_dict(settings)
    path, factor = gguf_file(p.get("model", ""), variants)
    if path is None or not path.exists():
        return Prediction()
    refused = kv_type_refusal(gguf_shape(path), p.get("type_k") or "f16", p.get("type_v") or "f16",
                              p.get("flash_attn") in (False, "off"))
    if refused:
        return Prediction(fits=False, reason=refused)
    placed = predict_placed(p, settings, variants)
    if placed is not None:
        return placed
    est = estimate_llamacpp_mb(path, int(p.get("n_ctx") or 0), p.get("type_k", "f16"),
                               p.get("type_v", "f16"), n_ubatch=int(p.get("n_ubatch") or 512),
                               logits_all=p.get("draft", "none") != "none", **kv_layout(p))
    weights = est["weights_mb"] * factor * MIB / GIB
    kv = est["kv_mb"] * MIB / GIB
    n_layers = est["n_layers"]
    ngl = int(p.get("n_gpu_layers") or 0)
    on_gpu = 1.0 if ngl < 0 else min(ngl, n_layers + 1) / (n_layers + 1)
    cpu_need = weights * (1 - on_gpu) + (kv if ngl == 0 or not p.get("offload_kqv", True) else 0.0)
    cpu_need += (est["logits_mb"] + est["runtime_mb"]) * MIB / GIB
    cpu_bw = ram_bandwidth_gbps(settings)
    active = est["active_weights_mb"] * factor * MIB  # bytes a token reads (active experts only)
    kv_ctx = est["kv_mb"] * MIB / max(est["n_ctx"], 1)  # KV bytes per token of context
    cpu_kv = ngl == 0 or not p.get("offload_kqv", True)
    ram = DeviceRead("RAM", active * (1 - on_gpu), kv_ctx * (1.0 if cpu_kv else 1 - on_gpu), cpu_bw,
                     ram_bandwidth_source(settings))
    if not ngl:
        upper = decode_bound([(weights * GIB, cpu_bw)])
        return verdict([cpu_need], [ram_available_gb()], ["RAM"], upper, (ram,))
    gpus = gpu_table(settings)
    if not gpus:
        return Prediction(reason="n_gpu_layers > 0 but no GPU is known (engine.settings.gpus)")
    split = parse_split(p.get("tensor_split")) or [1.0]
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
    reads = [ram] + [DeviceRead(f"GPU {i}", active * on_gpu * s / total,
                                0.0 if cpu_kv else kv_ctx * on_gpu * s / total,
                                g.get("bandwidth_gbps"), g.get("bandwidth_source", ""))
                     for i, (s, g) in enumerate(zip(split, gpus))]
    labels = ["RAM"] + [f"GPU {i}" for i in range(len(gpus))]
    return verdict([cpu_need] + need, [ram_available_gb()] + [float(g["memory_gb"]) for g in gpus],
                   labels, decode_bound(parts), tuple(reads))


def predict_placed(p: dict, settings: dict, variants: dict) -> Prediction | None:
    """RAM and VRAM per GPU and the decode bound of a MoE model from its tensor table
    (:mod:`autotune.engines.llamacpp.moe`): each layer's dense and expert bytes on the device
    that ``n_gpu_layers``, the expert overrides and the split give it; a token reads its
    layers' dense bytes and the active experts' share of the expert bytes there. None for a
    model without experts (:func:`predict_llamacpp` sizes it) or one not on disk.
    """
    settings = as_dict(settings)
    path, factor = gguf_file(p.get("model", ""), variants)
    if path is None or not path.exists():
        return None
    table = layer_table(path)
    if not table["moe"]:
        return None
    est = estimate_llamacpp_mb(path, int(p.get("n_ctx") or 0), p.get("type_k", "f16"),
                               p.get("type_v", "f16"), n_ubatch=int(p.get("n_ubatch") or 512),
                               **kv_layout(p))
    gpus = gpu_table(settings) if int(p.get("n_gpu_layers") or 0) else []
    if int(p.get("n_gpu_layers") or 0) and not gpus:
        return Prediction(reason="n_gpu_layers > 0 but no GPU is known (engine.settings.gpus)")
    placed = place(table, p, len(gpus), [float(g["memory_gb"]) for g in gpus])
    kv_layer = est["kv_mb"] * MIB / GIB / max(table["n_layers"], 1)
    kv = [0.0] * (len(gpus) + 1)
    for dev in placed["layer_device"][:-1]:
        kv[dev if p.get("offload_kqv", True) else 0] += kv_layer
    compute = est["compute_reserved_mb"] * MIB / GIB
    need = [h * factor / GIB + k for h, k in zip(placed["held"], kv)]
    need[0] += (est["logits_mb"] + est["runtime_mb"]) * MIB / GIB
    for j in range(1, len(need)):
        need[j] += GPU_OVERHEAD_GB + compute if placed["held"][j] else 0.0
    bws = [ram_bandwidth_gbps(settings)] + [g.get("bandwidth_gbps") for g in gpus]
    upper = decode_bound([(r * factor, bw) for r, bw in zip(placed["read"], bws)])
    labels = ["RAM"] + [f"GPU {i}" for i in range(len(gpus))]
    sources = [ram_bandwidth_source(settings)] + [g.get("bandwidth_source", "") for g in gpus]
    per_ctx = GIB / max(est["n_ctx"], 1)  # KV bytes per token of context, from GB at n_ctx
    reads = tuple(DeviceRead(label, r * factor, k * per_ctx, bw, src)
                  for label, r, k, bw, src in zip(labels, placed["read"], kv, bws, sources))
    return verdict(need, [ram_available_gb()] + [float(g["memory_gb"]) for g in gpus],
                   labels, upper, reads)
