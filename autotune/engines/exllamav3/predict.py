"""ExLlamaV3's pre-launch estimate: EXL3 weights + k/v-bit cache + draft per GPU, and a decode bound.

The bits per weight come from the model directory's ``config.json``: exllamav3's converter
writes ``quantization_config = {"quant_method": "exl3", "bits": <decoder bpw>, "head_bits":
<output layer bits>, ...}`` (``exllamav3/conversion/compile.py``). Without the directory the
variant's ``bpw`` is used (and ``head_bits`` 6, the converter's default). The shape comes from
:func:`autotune.engines.predict.hf_shape` (the directory, else a known shape). The cache costs
``(k_bits + v_bits) / 2`` bits per element plus one fp16 scale per 32 values, FP16 2 bytes.
Never loads a model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from autotune.engines.exllamav2.plan import gpus_of
from autotune.engines.exllamav3.plan import cache_bits
from autotune.engines.exllamav3.plan import load_plan
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

HEAD_BITS = 6  # exllamav3 convert.py --head_bits default
DEFAULT_VOCAB = 128_256  # Llama 3's, for a known shape whose config.json is not here


def exl3_bits(variant: dict) -> tuple[float, float] | None:
    """(decoder bpw, head bits) of an EXL3 variant: config.json's quantization_config, else ``bpw``."""
    cfg = Path(os.path.expanduser(str(variant.get("path", "")))) / "config.json"
    if cfg.is_file():
        q = json.loads(cfg.read_text()).get("quantization_config") or {}
        if q.get("quant_method") == "exl3" and q.get("bits"):
            return float(q["bits"]), float(q.get("head_bits") or HEAD_BITS)
    if variant.get("bpw"):
        return float(variant["bpw"]), float(HEAD_BITS)
    return None


def cache_bytes(mode: str) -> float:
    """Bytes per cached K or V element (averaged over K and V) for a cache mode."""
    bits = cache_bits(mode)
    if bits is None:
        return 2.0
    return (bits[0] + bits[1]) / 2 / 8 + 2 / 32


def _vocab(variant: dict) -> int:
    cfg = Path(os.path.expanduser(str(variant.get("path", "")))) / "config.json"
    if cfg.is_file():
        return int(json.loads(cfg.read_text()).get("vocab_size") or DEFAULT_VOCAB)
    return DEFAULT_VOCAB


def _weights_gb(variant: dict) -> tuple[dict, float] | None:
    """(shape, GiB of EXL3 weights): the decoder at ``bits``, the output layer at ``head_bits``."""
    shape, bits = hf_shape(variant), exl3_bits(variant)
    if shape is None or bits is None:
        return None
    head = float(shape["hidden"] * _vocab(variant))
    body = max(shape["n_params"] - head, 0.0)
    return shape, (body * bits[0] + head * bits[1]) / 8 / GIB


def predict_exllamav3(p: dict, settings: dict, variants: dict) -> Prediction:
    """Weights + cache at cache_size + draft, laid out as the load plan splits them, per GPU."""
    settings = as_dict(settings)
    gpus = gpu_table({"gpus": gpus_of(settings)} if gpus_of(settings) else settings)
    main = _weights_gb(variants.get(p.get("model")) or {})
    if main is None or not gpus:
        return Prediction()
    try:
        plan = load_plan(p, settings)
    except ValueError:
        return Prediction()
    shape, weights = main
    tokens = plan["cache"]["max_num_tokens"]
    cache = kv_gb(shape, tokens, cache_bytes(p["cache_mode"]))
    draft_gb = draft_w = 0.0
    k = plan["generator"]["num_draft_tokens"] or 0
    if plan["draft"]:
        d = _weights_gb(variants.get(plan["draft"]["variant"]) or {})
        if d is None:
            return Prediction()
        draft_w = d[1]
        draft_gb = draft_w + kv_gb(d[0], tokens, cache_bytes(p.get("draft_cache_mode") or "FP16"))
    mem = [float(g["memory_gb"]) for g in gpus]
    reserve = (plan["load"]["reserve_per_device"] or [0.0]) + [0.0] * len(gpus)
    need = [GPU_OVERHEAD_GB + reserve[i] for i in range(len(gpus))]
    need[0] += draft_gb
    model = weights + cache
    mode = plan["mode"]
    if mode == "single":
        share = [1.0] + [0.0] * (len(gpus) - 1)
    elif mode == "tp":  # by use_per_device when given, else by each GPU's memory
        split = plan["load"]["use_per_device"] or mem
        share = [s / sum(split) for s in (split + [0.0] * len(gpus))[: len(gpus)]]
    elif mode == "manual":
        split = (plan["load"]["use_per_device"] + [0.0] * len(gpus))[: len(gpus)]
        if model > sum(split):
            return Prediction(False, f"predicted OOM: {model:.1f} GB of weights and cache do not fit "
                              f"gpu_split {plan['load']['use_per_device']} ({sum(split):g} GB)",
                              (model,), (sum(split),))
        share = fill_manual(split, model)
    else:
        share = fill_auto(model, [m - n for m, n in zip(mem, need)])
    need = [n + model * s for n, s in zip(need, share)]
    bws = [g.get("bandwidth_gbps") for g in gpus]
    target = split_decode_bound(weights, share, bws, mode == "tp")
    upper = target
    if target and k and plan["draft"]:
        draft_t = draft_w * GIB / ((bws[0] or 1) * 1e9)
        upper = (k + 1) / (k * draft_t + 1.0 / target)
    elif target and k:  # n-gram drafting: every drafted token accepted, no draft model to run
        upper = target * (k + 1)
    return verdict(need, mem, decode_tps_upper=upper)
