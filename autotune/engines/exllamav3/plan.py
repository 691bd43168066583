"""Pure planning for ExLlamaV3 and its TabbyAPI (main branch) export: no exllamav3/torch imports.

The knobs are spelt as TabbyAPI main's ``config_sample.yml`` spells them, and the load follows
TabbyAPI main's exllamav3 backend (``backends/exllamav3/model.py`` at e632af41), so that what a
trial measures is what TabbyAPI will run:

- ``cache_mode``: ``FP16`` or ``"k,v"`` bits 2-8 (``CacheLayer_quant(k_bits, v_bits)``); the
  legacy ``Q4``/``Q6``/``Q8`` mean ``4,4``/``6,6``/``8,8`` (``create_cache``).
- ``cache_size`` defaults to ``max_seq_len`` and is rounded up to 256; ``max_seq_len`` is cut to
  it. ``chunk_size`` is at least 256, rounded up to 256. ``max_batch_size`` defaults to 128.
- GPUs (``model.load_gen``): one planned GPU loads there, ignoring split and tensor parallel;
  ``tensor_parallel`` loads ``tensor_p=True`` with ``tp_backend``; a manual ``gpu_split`` (GB per
  GPU) is ``use_per_device`` with no reserve; otherwise autosplit with ``reserve_per_device`` =
  ``autosplit_reserve`` MB / 1024 on GPU 0. Tensor parallel without a split keeps TabbyAPI's
  fixed 96 MB reserve (it reads ``autosplit_reserve`` only to autosplit over several GPUs).
- Drafting: ``draft_mode: model`` with a ``draft_model`` loads it first (autosplit, the same
  reserve) with its own cache (``draft_cache_mode``, FP16/Q8/Q6/Q4); ``draft_mode: ngram`` drafts
  from the context (``ngram_match_min``); ``draft_num_tokens`` is passed as
  ``num_draft_tokens`` and sizes the caches' ``max_history``.

:func:`load_plan` returns the keyword arguments of each call as a plain dict;
:func:`tabby_config` / :func:`tabby_yaml` write the main branch's ``config.yml`` from the same
parameters and :func:`tabby_warnings` says what TabbyAPI will do differently.
"""

from __future__ import annotations

import re
from typing import Any

from autotune.engines.exllamav2.plan import _dir_name
from autotune.engines.exllamav2.plan import gpus_of
from autotune.engines.exllamav2.plan import parse_split
from autotune.engines.exllamav2.plan import round_up

PAGE = 256
LEGACY_CACHE = {"Q4": "4,4", "Q6": "6,6", "Q8": "8,8"}
CACHE_PATTERN = re.compile(r"^([2-8])\s*,\s*([2-8])$")  # TabbyAPI's CACHE_TYPE pattern
DRAFT_CACHE_MODES = ("FP16", "Q8", "Q6", "Q4")  # TabbyAPI's CACHE_SIZES (draft_cache_mode)
DRAFT_MODES = ("model", "ngram", "disabled")
TP_BACKENDS = ("native", "nccl")
TABBY_RESERVE_MB = 96  # TabbyAPI's autosplit_reserve default, kept under tensor parallel
TABBY_MAX_BATCH = 128  # TabbyAPI main: max_batch_size default (4 for recurrent models)
DEFAULT_DRAFT_TOKENS = 4  # exllamav3 model caps default_draft_size / TabbyAPI's n-gram default
# Load/generator failures that mean "this configuration does not fit": torch's OOM and
# exllamav3's own allocation messages.
OOM_MARKERS = ("out of memory", "insufficient vram", "insufficient space", "not enough memory")


def cache_bits(mode: str) -> tuple[int, int] | None:
    """(k_bits, v_bits) of a cache mode; None for FP16. ValueError for anything else."""
    mode = LEGACY_CACHE.get(str(mode), str(mode))
    if mode == "FP16":
        return None
    m = CACHE_PATTERN.match(mode)
    if not m:
        raise ValueError(f"cache_mode {mode!r}: expected FP16 or k,v bits 2-8 like 8,8 "
                         "(legacy Q4, Q6, Q8 also accepted)")
    return int(m.group(1)), int(m.group(2))


def drafting(params: dict) -> str:
    """``"model"`` (a draft model), ``"ngram"`` or ``"none"``: what the trial drafts with."""
    mode = params.get("draft_mode") or "model"
    if mode == "ngram":
        return "ngram"
    if mode == "model" and (params.get("draft_model") or "none") != "none":
        return "model"
    return "none"


def split_mode(params: dict, settings: dict) -> tuple[str, list[float]]:
    """("single" | "tp" | "manual" | "auto", GB per GPU) as TabbyAPI decides it."""
    _, split = parse_split(params.get("gpu_split"))
    if len(gpus_of(settings)) == 1:
        return "single", []
    if params.get("tensor_parallel"):
        return "tp", split
    return ("manual", split) if split else ("auto", [])


def load_plan(params: dict, settings: dict) -> dict[str, Any]:
    """The exllamav3 calls of a trial, as TabbyAPI main makes them (see the module docstring)."""
    mode, split = split_mode(params, settings)
    max_seq_len = int(params["max_seq_len"])
    cache_size = round_up(int(params.get("cache_size") or max_seq_len), PAGE)
    max_seq_len = min(max_seq_len, cache_size)
    chunk = round_up(max(PAGE, int(params["chunk_size"])), PAGE)
    batch = int(params.get("max_batch_size") or TABBY_MAX_BATCH)
    draft = drafting(params)
    k = int(params.get("draft_num_tokens") or DEFAULT_DRAFT_TOKENS) if draft != "none" else None
    if mode == "manual":
        reserve = None  # TabbyAPI: "causes crash if set with GPU split"
    elif mode in ("tp", "single"):
        reserve = [TABBY_RESERVE_MB / 1024]  # TabbyAPI reads autosplit_reserve only to autosplit
    else:
        reserve = [float(params.get("autosplit_reserve", TABBY_RESERVE_MB)) / 1024]
    bits = cache_bits(params["cache_mode"])
    cache = {"max_num_tokens": cache_size, "max_batch_size": batch, "max_history": k or 0,
             "k_bits": bits[0] if bits else None, "v_bits": bits[1] if bits else None}
    ngram = int(params.get("ngram_match_min") or 2) if draft == "ngram" else 0
    plan: dict[str, Any] = {
        "mode": mode, "max_seq_len": max_seq_len, "cache": cache,
        "load": {"tensor_p": mode == "tp", "tp_backend": params.get("tensor_parallel_backend") or "native",
                 "reserve_per_device": reserve, "use_per_device": split or None,
                 "max_chunk_size": chunk, "max_batch_size": batch},
        "generator": {"max_batch_size": batch, "max_chunk_size": chunk, "num_draft_tokens": k,
                      "ngram_match_min": ngram},
        "draft": None,
    }
    if draft == "model":
        dbits = cache_bits(params.get("draft_cache_mode") or "FP16")
        plan["draft"] = {
            "variant": params["draft_model"],
            "load": {"reserve_per_device": reserve, "use_per_device": None},
            "cache": {**cache, "k_bits": dbits[0] if dbits else None, "v_bits": dbits[1] if dbits else None},
        }
    return plan


def plan_reasons(params: dict, settings: dict) -> list[str]:
    """Combinations ExLlamaV3 / TabbyAPI main refuse ([] if none)."""
    out: list[str] = []
    try:
        cache_bits(params.get("cache_mode", "FP16"))
    except ValueError as e:
        out.append(str(e))
    try:
        parse_split(params.get("gpu_split"))
    except ValueError as e:
        out.append(str(e))
    if params.get("draft_cache_mode", "FP16") not in DRAFT_CACHE_MODES:
        out.append(f"draft_cache_mode={params.get('draft_cache_mode')!r} is not one of "
                   f"{', '.join(DRAFT_CACHE_MODES)} (TabbyAPI's draft cache modes)")
    if params.get("cache_size") and params["cache_size"] < params["max_seq_len"]:
        out.append(f"cache_size={params['cache_size']} < max_seq_len={params['max_seq_len']}")
    if int(params.get("chunk_size", PAGE)) % PAGE:
        out.append(f"chunk_size={params['chunk_size']} must be a multiple of {PAGE} (TabbyAPI rounds it up)")
    gpus = gpus_of(settings)
    if params.get("tensor_parallel") and gpus and len(gpus) < 2:
        out.append("tensor_parallel needs at least 2 GPUs (TabbyAPI ignores it on one)")
    return out


def failure_reason(exc: BaseException) -> str | None:
    """Why a load/generator error means an infeasible configuration; None for a real failure.

    Only running out of memory is infeasible: a missing model directory or a refused
    argument is the user's to fix, so it fails the trial (issue 18).
    """
    name, text = type(exc).__name__, str(exc)
    if name == "OutOfMemoryError" or any(m in text.lower() for m in OOM_MARKERS):
        return f"out of GPU memory: {name}: {text}"
    return None


# ---- TabbyAPI export (main) --------------------------------------------------------------
def tabby_warnings(params: dict, settings: dict | None = None, in_process: bool = True) -> list[str]:
    """What TabbyAPI main will run differently from the measured trial."""
    settings = settings or {}
    out = []
    mode = split_mode(params, settings)[0]
    if len(gpus_of(settings)) == 1 and (params.get("tensor_parallel")
                                        or parse_split(params.get("gpu_split"))[0] != "auto"):
        out.append("TabbyAPI ignores gpu_split and tensor_parallel with a single GPU.")
    if mode == "tp" and params.get("tensor_parallel_backend") == "nccl":
        out.append("tensor_parallel_backend=nccl: TabbyAPI falls back to native when exllamav3 "
                   "was built without NCCL.")
    if mode in ("tp", "single") and int(params.get("autosplit_reserve", TABBY_RESERVE_MB)) != TABBY_RESERVE_MB:
        out.append(f"autosplit_reserve={params['autosplit_reserve']} has no effect with "
                   f"{'tensor parallel' if mode == 'tp' else 'one GPU'}: TabbyAPI (and the trial) "
                   f"keep {TABBY_RESERVE_MB} MB.")
    if in_process:
        out.append("Measured with exllamav3's Generator in-process; TabbyAPI wraps the same "
                   "generator in its AsyncGenerator with output chunking and its own sampler, "
                   "so re-measure through TabbyAPI (engine tabbyapi) before relying on the speed.")
    return out


def tabby_config(params: dict, settings: dict, variants: dict) -> dict:
    """config.yml for TabbyAPI main (``backend: exllamav3``; keys of its config_sample.yml)."""
    plan = load_plan(params, settings)
    model_dir, model_name = _dir_name((variants.get(params.get("model")) or {}).get("path"))
    mode, split = split_mode(params, settings)
    draft = drafting(params)
    d_dir, d_name = _dir_name((variants.get(params.get("draft_model")) or {}).get("path")
                              if draft == "model" else None)
    cache_mode = str(params["cache_mode"])
    return {
        "network": {"host": "127.0.0.1", "port": int(settings.get("export_port") or 5000)},
        "model": {
            "model_dir": model_dir, "model_name": model_name, "backend": "exllamav3",
            "max_seq_len": plan["max_seq_len"], "cache_size": plan["cache"]["max_num_tokens"],
            "cache_mode": LEGACY_CACHE.get(cache_mode, cache_mode).replace(" ", ""),
            "tensor_parallel": mode == "tp", "tensor_parallel_backend": plan["load"]["tp_backend"],
            "gpu_split_auto": mode in ("auto", "single"), "gpu_split": split,
            "autosplit_reserve": [int(params.get("autosplit_reserve", TABBY_RESERVE_MB))],
            "chunk_size": plan["load"]["max_chunk_size"], "max_batch_size": plan["load"]["max_batch_size"],
        },
        "draft_model": {
            "draft_mode": {"model": "model", "ngram": "ngram"}.get(draft, "disabled"),
            "draft_model_dir": d_dir, "draft_model_name": d_name,
            "draft_cache_mode": params.get("draft_cache_mode") or "FP16",
            "draft_num_tokens": plan["generator"]["num_draft_tokens"],
            "ngram_match_min": plan["generator"]["ngram_match_min"] or None,
        },
    }


def tabby_yaml(config: dict, warnings: list[str], branch: str = "main") -> str:
    """A config as YAML, with what it cannot reproduce as WARNING comments at the top."""
    import yaml

    head = [f"# TabbyAPI config.yml ({branch} branch) exported by autotune.",
            "# Copy to tabbyAPI/config.yml; unlisted keys keep TabbyAPI's defaults."]
    head += ["# WARNING: " + w for w in warnings]
    body = yaml.safe_dump(config, sort_keys=False, default_flow_style=None)
    return "\n".join(head) + "\n" + body
