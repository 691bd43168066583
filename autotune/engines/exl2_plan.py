"""Pure planning for ExLlamaV2 0.3.2 and its TabbyAPI export (no exllamav2/torch imports).

:func:`load_plan` maps trial parameters to the load calls (cache class, split mode, cache
and chunk sizes, generator arguments, draft); :func:`split_reasons` checks a manual
gpu_split against each GPU's memory; :func:`tabby_config` / :func:`tabby_yaml` write a
``config.yml`` for TabbyAPI's exl2-checkpoint branch and :func:`tabby_warnings` says what
TabbyAPI cannot reproduce (it always drafts 4 tokens; it has no layer skipping).
Everything here runs and is tested on CPU.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

CACHE_MODES = ("FP16", "Q8", "Q6", "Q4")
CACHE_CLASSES = {"FP16": "ExLlamaV2Cache", "Q8": "ExLlamaV2Cache_Q8", "Q6": "ExLlamaV2Cache_Q6",
                 "Q4": "ExLlamaV2Cache_Q4"}
PAGE = 256  # PAGED_PAGE_SIZE: cache sizes and chunk sizes are multiples of it
MAX_Q_SIZE = 8  # generator default; num_draft_tokens <= max_q_size
TABBY_DRAFT_K = 4  # TabbyAPI's exllamav2 backend never passes num_draft_tokens


def round_up(n: int, step: int = PAGE) -> int:
    return int(math.ceil(n / step) * step)


def parse_split(value: Any) -> tuple[str, list[float]]:
    """``gpu_split`` → (mode, GB per GPU): ("auto", []), ("tp", []) or ("manual", [..])."""
    if value in (None, "auto"):
        return "auto", []
    if value == "tp":
        return "tp", []
    if isinstance(value, str):
        try:
            value = [float(x) for x in value.replace(" ", "").split(",") if x]
        except ValueError as e:
            raise ValueError(f"gpu_split {value!r}: expected auto, tp or GB per GPU like 30,26") from e
    if isinstance(value, (list, tuple)) and value and all(isinstance(x, (int, float)) for x in value):
        return "manual", [float(x) for x in value]
    raise ValueError(f"gpu_split {value!r}: expected auto, tp or GB per GPU like [30, 26]")


def gpus_of(settings: dict) -> list[dict]:
    """The resource plan's GPUs: settings.gpus = [{name, memory_gb}, ...]."""
    return list(settings.get("gpus") or [])


def split_reasons(split: list[float], gpus: list[dict]) -> list[str]:
    """Why a manual split cannot fit the planned GPUs ([] if it fits)."""
    if not gpus:
        return []
    if len(split) > len(gpus):
        return [f"gpu_split {split} names {len(split)} GPUs; the plan has {len(gpus)}"]
    return [f"gpu_split puts {gb:g} GB on GPU {i} ({gpus[i].get('name', '?')}), "
            f"which has {gpus[i]['memory_gb']:g} GB"
            for i, gb in enumerate(split) if gb > float(gpus[i]["memory_gb"])]


def load_plan(params: dict, settings: dict) -> dict[str, Any]:
    """How the worker loads the model: a plain dict (what the exllamav2 calls receive)."""
    mode, split = parse_split(params.get("gpu_split"))
    n_gpus = max(len(gpus_of(settings)), 1)
    max_seq_len = int(params["max_seq_len"])
    chunk = int(params["chunk_size"])
    cache_size = round_up(max(int(params.get("cache_size") or 0), max_seq_len))
    draft = params.get("draft_model") or "none"
    reserve = [int(params.get("autosplit_reserve_mb", 96)) * 1024**2] + [0] * (n_gpus - 1)
    return {
        "mode": mode, "gpu_split": split, "reserve_vram": reserve, "cache_class": CACHE_CLASSES[params["cache_mode"]],
        "cache_size": cache_size, "max_seq_len": max_seq_len, "max_input_len": chunk,
        "max_attention_size": chunk**2, "no_graphs": mode == "tp",
        "generator": {"max_batch_size": params.get("max_batch_size"), "max_chunk_size": chunk,
                      "max_seq_len": max_seq_len,
                      "num_draft_tokens": int(params["num_draft_tokens"]) if draft != "none" else 4},
        "draft": None if draft == "none" else {
            "variant": draft, "cache_class": CACHE_CLASSES[params.get("draft_cache_mode", "FP16")],
        },
        "layer_skip_threshold": params.get("layer_skip_threshold"),
    }


def skip_candidates(n_layers: int) -> range:
    """Layers that may be skipped: the middle half (the first and last quarter always run)."""
    return range(n_layers // 4, n_layers - n_layers // 4)


def select_skips(similarity: list[float], threshold: float | None) -> list[int]:
    """Middle-half layers whose cos(input, output) is above ``threshold``."""
    if threshold is None or threshold >= 1.0:
        return []
    return [i for i in skip_candidates(len(similarity)) if similarity[i] > threshold]


def filter_modules(modules: list, layer_starts: list[int], skip: list[int]) -> tuple[list, int, int]:
    """Drop the modules of the skipped layers (§1.4).

    ``layer_starts[i]`` is the index in ``modules`` of layer i's first module (its
    attention); layer i ends where layer i+1 starts, the last layer at the final norm,
    ``layer_starts[-1]``, which is therefore one longer than the number of layers.
    Returns (modules, head_layer_idx, last_kv_layer_idx) for the filtered model.
    """
    drop: set[int] = set()
    for i in skip:
        drop.update(range(layer_starts[i], layer_starts[i + 1]))
    kept = [m for j, m in enumerate(modules) if j not in drop]
    attn = {id(modules[s]) for i, s in enumerate(layer_starts[:-1]) if i not in skip}
    last_kv = max(j for j, m in enumerate(kept) if id(m) in attn)
    return kept, len(kept) - 1, last_kv


# ---- TabbyAPI export (exl2-checkpoint) -----------------------------------------------------
def _dir_name(path: str | None) -> tuple[str, str | None]:
    if not path:
        return "models", None
    p = Path(path)
    return str(p.parent), p.name


def tabby_warnings(params: dict, settings: dict | None = None) -> list[str]:
    """What the TabbyAPI export cannot reproduce of the tuned configuration."""
    out = []
    draft = params.get("draft_model") or "none"
    k = params.get("num_draft_tokens")
    if draft != "none" and k is not None and int(k) != TABBY_DRAFT_K:
        out.append(
            f"num_draft_tokens={k} was tuned, but TabbyAPI's exllamav2 backend ignores "
            f"draft_num_tokens and always drafts {TABBY_DRAFT_K} tokens: the served speed will "
            f"differ from the measured one (run exllamav2 directly to use K={k})."
        )
    if params.get("layer_skip_threshold") is not None and float(params["layer_skip_threshold"]) < 1.0:
        out.append(
            f"layer_skip_threshold={params['layer_skip_threshold']} was tuned, but layer skipping "
            "is not a TabbyAPI option: TabbyAPI runs every layer, so speed and quality will "
            "differ from the measured ones."
        )
    if len(gpus_of(settings or {})) == 1 and parse_split(params.get("gpu_split"))[0] != "auto":
        out.append("TabbyAPI ignores gpu_split and tensor_parallel with a single GPU.")
    return out


def tabby_config(params: dict, settings: dict, variants: dict) -> dict:
    """config.yml for TabbyAPI's exl2-checkpoint branch (keys of its config_sample.yml)."""
    plan = load_plan(params, settings)
    model_dir, model_name = _dir_name((variants.get(params.get("model")) or {}).get("path"))
    mode, split = plan["mode"], plan["gpu_split"]
    draft = plan["draft"]
    d_dir, d_name = _dir_name((variants.get(draft["variant"]) or {}).get("path") if draft else None)
    return {
        "network": {"host": "127.0.0.1", "port": int(settings.get("export_port", 5000))},
        "model": {
            "model_dir": model_dir, "model_name": model_name, "backend": "exllamav2",
            "max_seq_len": plan["max_seq_len"], "cache_size": plan["cache_size"],
            "cache_mode": params["cache_mode"], "tensor_parallel": mode == "tp",
            "gpu_split_auto": mode == "auto", "gpu_split": split,
            "autosplit_reserve": [int(params.get("autosplit_reserve_mb", 96))],
            "chunk_size": plan["max_input_len"], "max_batch_size": params.get("max_batch_size"),
        },
        "draft_model": {
            "draft_model_dir": d_dir, "draft_model_name": d_name,
            "draft_cache_mode": params.get("draft_cache_mode", "FP16"), "draft_gpu_split": [],
            "draft_num_tokens": plan["generator"]["num_draft_tokens"] if draft else None,
        },
    }


def tabby_yaml(params: dict, settings: dict, variants: dict) -> str:
    """The config as YAML, with the export's warnings as comments at the top."""
    import yaml

    head = ["# TabbyAPI config.yml (exl2-checkpoint branch) exported by autotune.",
            "# Copy to tabbyAPI/config.yml; unlisted keys keep TabbyAPI's defaults."]
    for w in tabby_warnings(params, settings):
        head.append("# WARNING: " + w)
    body = yaml.safe_dump(tabby_config(params, settings, variants), sort_keys=False, default_flow_style=None)
    return "\n".join(head) + "\n" + body
