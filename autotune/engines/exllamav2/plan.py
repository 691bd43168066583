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
CUDA_CONTEXT_GIB = 0.5  # left free per GPU by a manual split (CUDA context, scratch)
# Messages of load/generator failures that mean "this configuration does not fit" (v0.3.2):
# model.py::load_autosplit_gen "Insufficient VRAM for model and cache", model.py::set_device_map
# "Insufficient space in device allocation", torch's "CUDA out of memory".
OOM_MARKERS = ("Insufficient VRAM for model and cache", "Insufficient space in device allocation",
               "CUDA out of memory", "out of memory")
# exllamav2 0.3.2 asserts on the configuration (generator/dynamic.py, model.py, cache.py): a
# trial that hits one of these is infeasible. Any other assert is a real failure.
REFUSAL_MARKERS = ("max_chunk_size", "max_q_size", "num_draft_tokens", "max_batch_size", "max_seq_len",
                   "seq len", "max_input_len", "Paged mode requires flash-attn", "paged attention",
                   "8-bit cache", "Cache and draft cache", "multiple of", "gpu_split", "tensor-parallel",
                   "tensor parallel")
# Model files missing or broken (exllamav2/config.py::prepare): a real failure.
MODEL_FILE_MARKERS = ("Can't find", "No model_dir", "No .safetensors files", "Could not find",
                      "Missing any of the following keys", "No such file", "does not exist")


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


def validate_gpu_settings(settings: dict, variants: dict, path: str) -> None:
    """An ExLlama engine needs a model variant and GPUs spelled ``{name, memory_gb: NUMBER}``."""
    from autotune.engines.variants import validate_variants
    from autotune.errors import ConfigError

    if not variants:
        validate_variants(variants, f"{path}.variants")
    for i, g in enumerate(gpus_of(settings)):
        if not isinstance(g, dict) or not isinstance(g.get("memory_gb"), (int, float)):
            raise ConfigError(f"{path}.settings.gpus[{i}]", g, "expected {name: ..., memory_gb: NUMBER}")


def split_reasons(split: list[float], gpus: list[dict], reserve_gb: float = CUDA_CONTEXT_GIB) -> list[str]:
    """Why a manual split (GiB per GPU, in CUDA order) cannot fit the planned GPUs ([] if it fits).

    The one GPU-split check of autotune. ``gpus`` are ``{name, memory_gb}`` (GiB, as on the
    card's box and in nvidia-smi; see :mod:`autotune.hardware`); ``split`` is exllamav2's
    ``gpu_split``, which is GiB too (``model.py::set_device_map``: ``a * 1024**3``).
    ``reserve_gb`` is left free on each GPU for the CUDA context.
    """
    if not gpus:
        return []
    reasons = []
    if len(split) > len(gpus):
        reasons.append(f"gpu_split {split} names {len(split)} GPUs; the plan has {len(gpus)}")
    for i, (want, dev) in enumerate(zip(split, gpus, strict=False)):
        have = float(dev.get("memory_gb", math.inf)) - reserve_gb
        if want > have:
            reasons.append(f"GPU {i} ({dev.get('name', 'GPU')}, {dev.get('memory_gb'):g} GB): gpu_split "
                           f"puts {want:g} GiB on it, at most {have:g} usable")
    return reasons


def clamp_chunk(chunk_size: int, max_seq_len: int) -> int:
    """TabbyAPI's chunk size rule: within [256, max_seq_len], rounded up to a multiple of 256.

    (TABBY-exl2 backends/exllamav2/model.py: ``sorted((256, chunk, max_seq_len))[1]`` then
    rounded up; exllamav2's ``load_autosplit_gen`` also caps ``max_input_len`` at ``max_seq_len``.)
    """
    return round_up(sorted((PAGE, int(chunk_size), int(max_seq_len)))[1])


def reserve_vram(reserve_mb: float, n_devices: int) -> list[int]:
    """``reserve_vram`` for ``load_autosplit``: one entry per visible device (bytes).

    ``load_autosplit_gen`` indexes the list by device ordinal up to ``torch.cuda.device_count()``,
    so a shorter list raises IndexError when autosplit moves on to a further GPU. As TabbyAPI,
    GPU 0 gets the reserve and the others 0.
    """
    return [int(math.ceil(reserve_mb * 1024**2))] + [0] * max(n_devices - 1, 0)


def choose_paged(requested: bool | None, paged_attn: bool, min_compute_capability: int | None) -> tuple[bool, str]:
    """Paged (batched) or non-paged generator mode, and why.

    exllamav2's ``ExLlamaV2DynamicGenerator(paged=True)`` calls ``attn.assert_paged_attn()``,
    which needs flash-attn >= 2.5.7; flash-attn needs compute capability >= 8. TabbyAPI falls back
    to ``paged=False, max_batch_size=1`` when it is missing (backends/exllamav2/model.py,
    ``hardware_supports_flash_attn``). ``requested`` None = auto; True fails if unsupported.
    """
    ok = paged_attn and (min_compute_capability is None or min_compute_capability >= 8)
    why = "" if ok else ("flash-attn >= 2.5.7 is not installed" if not paged_attn
                         else f"a GPU has compute capability {min_compute_capability} < 8")
    if requested is None:
        return (True, "paged: flash-attn available") if ok else (False, f"non-paged: {why}")
    if requested and not ok:
        raise ValueError(f"paged=true needs paged attention, but {why}")
    return bool(requested), "paged" if requested else "non-paged (asked for)"


def failure_reason(exc: BaseException) -> str | None:
    """Why a load/generator error means an infeasible configuration; None for a real failure.

    exllamav2 validates with ``assert`` and ``ValueError`` both the configuration (which is
    infeasible: the next trial may fit) and the model files (which is a real failure that must
    not be pruned silently: ``config.py`` asserts "Can't find <model_dir>", raises "No
    .safetensors files found"). Only the messages of :data:`REFUSAL_MARKERS` count as a refusal.
    """
    name, text = type(exc).__name__, str(exc)
    if name == "OutOfMemoryError" or any(m.lower() in text.lower() for m in OOM_MARKERS):
        return f"out of GPU memory: {name}: {text}"
    if any(m.lower() in text.lower() for m in MODEL_FILE_MARKERS):
        return None
    if isinstance(exc, (AssertionError, ValueError)) and any(m in text for m in REFUSAL_MARKERS):
        return f"exllamav2 refused the configuration: {name}: {text}"
    return None


def job_args(max_tokens: int, ignore_eos: bool, num_draft_tokens: int, eos_token_id: int | None) -> dict:
    """``ExLlamaV2DynamicJob`` arguments that make a job generate exactly ``max_tokens`` tokens.

    exllamav2 0.3.2 ends a job at ``new_tokens >= max_new_tokens - generator.num_draft_tokens``
    (``generator/dynamic.py::ExLlamaV2DynamicJob.receive_sample``; ``num_draft_tokens`` is 0
    without a draft model or n-gram drafting), so that the drafted positions stay inside the
    job's cache pages, which are sized by ``max_new_tokens``. Asking for ``max_tokens + K``
    gives ``max_tokens`` tokens, as many as a trial without a draft generates.
    """
    k = max(int(num_draft_tokens or 0), 0)
    return {"max_new_tokens": int(max_tokens) + k, "min_new_tokens": int(max_tokens) if ignore_eos else 0,
            "stop_conditions": [] if ignore_eos or eos_token_id is None else [eos_token_id]}


def load_plan(params: dict, settings: dict, paged: bool = True) -> dict[str, Any]:
    """How the worker loads the model: a plain dict (what the exllamav2 calls receive).

    ``paged`` False is the non-paged mode: batch size 1 and a cache of ``max_seq_len``.
    ``reserve_vram`` has one entry per planned GPU; the worker re-pads it to the visible count.
    """
    mode, split = parse_split(params.get("gpu_split"))
    n_gpus = max(len(gpus_of(settings)), 1)
    max_seq_len = int(params["max_seq_len"])
    chunk = clamp_chunk(int(params["chunk_size"]), max_seq_len)
    cache_size = round_up(max(int(params.get("cache_size") or 0), max_seq_len) if paged else max_seq_len)
    draft = params.get("draft_model") or "none"
    reserve = reserve_vram(float(params.get("autosplit_reserve_mb", 96)), n_gpus)
    batch = params.get("max_batch_size") if paged else 1
    return {"paged": paged,
        "mode": mode, "gpu_split": split, "reserve_vram": reserve, "cache_class": CACHE_CLASSES[params["cache_mode"]],
        "cache_size": cache_size, "max_seq_len": max_seq_len, "max_input_len": chunk,
        "max_attention_size": chunk**2, "no_graphs": mode == "tp",
        "generator": {"max_batch_size": batch, "max_chunk_size": chunk, "max_seq_len": max_seq_len,
                      "paged": paged,
                      "num_draft_tokens": int(params["num_draft_tokens"]) if draft != "none" else 4},
        "draft": None if draft == "none" else {
            "variant": draft, "cache_class": CACHE_CLASSES[params.get("draft_cache_mode", "FP16")],
        },
        "layer_skip_threshold": params.get("layer_skip_threshold"),
    }


def tabby_load_forward(model: Any, cache: Any, max_input_len: int, torch: Any) -> None:
    """TabbyAPI's load check: a forward of ``max_input_len`` zeros into the cache.

    TabbyAPI (exl2-checkpoint, ``backends/exllamav2/model.py::load_model_sync``) runs it after
    loading the draft and the model "to test VRAM allocation with a full-length forward pass";
    the trial too, so its VRAM peak (a whole chunk's activations, which the 32-token warm-up
    lacks) is the one TabbyAPI meets. The cache position is reset (the generator pages its own).
    """
    ids = torch.zeros((1, int(max_input_len)), dtype=torch.long)
    with torch.inference_mode():
        model.forward(ids, cache=cache, preprocess_only=True)
    if hasattr(cache, "current_seq_len"):
        cache.current_seq_len = 0


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


def mode_warnings(params: dict) -> list[str]:
    """Where the measured generator mode may differ from the one TabbyAPI will run.

    TabbyAPI (exl2-checkpoint, ``backends/exllamav2/model.py``) runs the paged generator with
    flash-attn and batching whenever flash-attn is installed and every GPU is Ampere or newer,
    else non-paged with ``max_batch_size`` 1; it has no setting to choose. The trial ran
    ``paged`` as asked (``info.generator_mode`` says which ran when it was left to auto).
    """
    paged = params.get("paged")
    if paged is False:
        return ["paged=false was measured (non-paged, batch size 1, no flash-attn), but TabbyAPI "
                "runs paged with flash-attn and batching wherever flash-attn >= 2.5.7 is installed "
                "and every GPU is Ampere or newer: served speed and VRAM will differ from the "
                "measured ones (uninstall flash-attn on the server to reproduce them)."]
    if paged is None:
        return ["The generator mode was chosen on the trial machine (paged with flash-attn, else "
                "non-paged batch 1; see the trials' info.generator_mode). TabbyAPI chooses the same "
                "way on its own machine: if flash-attn or the GPU generation differs there, served "
                "speed and VRAM will differ from the measured ones."]
    return ["paged=true was measured; TabbyAPI falls back to non-paged batch size 1 without "
            "flash-attn >= 2.5.7 or on a pre-Ampere GPU: install flash-attn on the server."]


def tabby_config(params: dict, settings: dict, variants: dict) -> dict:
    """config.yml for TabbyAPI's exl2-checkpoint branch (keys of its config_sample.yml)."""
    plan = load_plan(params, settings)
    model_dir, model_name = _dir_name((variants.get(params.get("model")) or {}).get("path"))
    mode, split = plan["mode"], plan["gpu_split"]
    draft = plan["draft"]
    d_dir, d_name = _dir_name((variants.get(draft["variant"]) or {}).get("path") if draft else None)
    return {
        "network": {"host": "127.0.0.1", "port": int(settings.get("export_port") or 5000)},
        "model": {
            "model_dir": model_dir, "model_name": model_name, "backend": "exllamav2",
            "max_seq_len": plan["max_seq_len"], "cache_size": plan["cache_size"],
            "cache_mode": params["cache_mode"], "tensor_parallel": mode == "tp",
            "gpu_split_auto": mode == "auto", "gpu_split": split,
            "autosplit_reserve": [int(params.get("autosplit_reserve_mb", 96))],
            "chunk_size": plan["max_input_len"], "max_batch_size": params.get("max_batch_size"),
            # exllamav2 keeps config.scale_alpha_value = 1.0; TabbyAPI's default "auto" would
            # raise it when max_seq_len exceeds the model's max_position_embeddings.
            "rope_alpha": 1.0,
        },
        "draft_model": {
            "draft_model_dir": d_dir, "draft_model_name": d_name,
            "draft_cache_mode": params.get("draft_cache_mode", "FP16"), "draft_gpu_split": [],
            "draft_num_tokens": plan["generator"]["num_draft_tokens"] if draft else None,
            "draft_rope_alpha": 1.0 if draft else None,
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
