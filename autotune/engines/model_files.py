"""What ``autotune init`` reads from model files: GGUF headers and EXL2/EXL3 directories.

:func:`read_model` describes one path (a :class:`ModelFile`: format, architecture, layers,
trained context, quant, bits per weight, size) without loading it; :func:`group_models`
sorts the paths given into the variants of one model and at most one draft (a smaller model
of the same architecture and vocabulary). Bad paths raise
:class:`~autotune.errors.ConfigError` (exit 2, nothing written).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path

from autotune.engines.llamacpp.gguf_memory import read_gguf_metadata
from autotune.engines.llamacpp.predict import FTYPE_BPW
from autotune.engines.predict import GIB
from autotune.engines.predict import hf_shape
from autotune.engines.variants import QUANT_TYPES
from autotune.errors import ConfigError

FTYPE_NAMES = {0: "F32", 1: "F16", 32: "BF16", **{v[0]: k for k, v in QUANT_TYPES.items()}}
_BPW_IN_NAME = re.compile(r"(\d+(?:\.\d+)?)\s*bpw", re.I)


@dataclass(frozen=True)
class ModelFile:
    """One model file or directory, as read from its header / config (never loaded).

    ``family`` is what variants of one model share (architecture, vocabulary, layers, width);
    ``lineage`` what a draft shares with its target (architecture and vocabulary).
    """

    path: Path
    format: str  # gguf | exl2 | exl3
    arch: str
    title: str  # "Gemma 3 270m", the directory name...
    n_layers: int
    n_ctx_train: int
    quant: str  # Q4_K_M, 4.0bpw
    bpw: float
    size_gb: float  # GiB on disk (GGUF) or weights at bpw (EXL2)
    n_params: float
    vocab: int
    width: int
    name: str = ""  # the variant name in the preset

    @property
    def family(self) -> tuple:
        return (self.format, self.arch, self.vocab, self.n_layers, self.width)

    @property
    def lineage(self) -> tuple:
        return (self.arch, self.vocab)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "_", text.lower()).strip("_") or "model"


def read_gguf(path: Path) -> ModelFile:
    try:
        meta = read_gguf_metadata(path)
    except (ValueError, OSError) as e:
        raise ConfigError("MODEL", str(path), f"not a readable GGUF file ({e})") from e
    arch = str(meta.get("general.architecture") or "")
    if not arch or f"{arch}.block_count" not in meta:
        raise ConfigError("MODEL", str(path), "a GGUF without general.architecture / block_count")

    def get(key: str, default: int = 0) -> int:
        v = meta.get(f"{arch}.{key}", default)
        return int(max(v) if isinstance(v, list) else v)

    ftype = int(meta.get("general.file_type", -1))
    bpw = FTYPE_BPW.get(ftype, 16.0)
    size = path.stat().st_size
    title = " ".join(str(meta.get(k, "")) for k in ("general.name",) if meta.get(k)) or path.stem
    return ModelFile(path, "gguf", arch, title, get("block_count"), get("context_length"),
                     FTYPE_NAMES.get(ftype, f"ftype{ftype}"), bpw, size / GIB, size * 8 / bpw,
                     int(meta.get(f"{arch}.vocab_size") or meta.get("tokenizer.ggml.tokens") or 0),
                     get("embedding_length"))


def read_exl_dir(path: Path) -> ModelFile:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ConfigError("MODEL", str(path), "a directory without config.json is no model; give a "
                          "GGUF file or an EXL2/EXL3 model directory")
    try:
        cfg = json.loads(cfg_file.read_text())
        shape = hf_shape({"path": str(path)})
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError("MODEL", str(path), f"config.json is not a model config ({e})") from e
    qcfg = cfg.get("quantization_config") or {}
    method = str(qcfg.get("quant_method", "")).lower()
    if method not in ("exl2", "exl3") and not (path / "measurement.json").is_file():
        raise ConfigError("MODEL", str(path), "no EXL2/EXL3 quantization (config.json has no "
                          "quantization_config.quant_method exl2/exl3 and there is no measurement.json)")
    fmt = method or "exl2"
    bits = qcfg.get("bits")
    if bits is None:
        found = _BPW_IN_NAME.search(path.name)
        bits = float(found.group(1)) if found else None
    if bits is None:
        raise ConfigError("MODEL", str(path), "bits per weight unknown: no quantization_config.bits "
                          "and no '4.0bpw' in the directory name")
    bpw = float(bits)
    return ModelFile(path, fmt, str(cfg.get("model_type", "?")), path.name, shape["n_layers"],
                     int(cfg.get("max_position_embeddings", 0)), f"{bpw:.1f}bpw", bpw,
                     shape["n_params"] * bpw / 8 / GIB, shape["n_params"],
                     int(cfg.get("vocab_size", 0)), shape["hidden"])


def read_model(arg: str) -> ModelFile:
    """One MODEL argument: a GGUF file or an EXL2/EXL3 directory (ConfigError otherwise)."""
    path = Path(arg).expanduser()
    if not path.exists():
        raise ConfigError("MODEL", arg, "no such file or directory")
    path = path.resolve()
    if path.is_dir():
        return read_exl_dir(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ConfigError("MODEL", arg, "not a model: expected a GGUF file or an EXL2/EXL3 directory")
    return read_gguf(path)


def _names(models: list[ModelFile], prefix: str = "") -> list[ModelFile]:
    out, seen = [], set()
    for m in models:
        name = prefix + _slug(m.quant)
        if name in seen:
            name = prefix + _slug(m.path.stem if m.format == "gguf" else m.path.name)
        while name in seen:
            name += "_"
        seen.add(name)
        out.append(replace(m, name=name))
    return out


@dataclass(frozen=True)
class ModelSet:
    """The variants of one model (best quant first) and at most one draft."""

    variants: list[ModelFile]
    draft: ModelFile | None
    first: str  # the variant of the first path given (what the user runs today: trial 0)

    @property
    def best(self) -> ModelFile:
        return self.variants[0]


def group_models(models: list[ModelFile]) -> ModelSet:
    """The largest model's files become variants; a smaller one of the same lineage a draft."""
    if not models:
        raise ConfigError("MODEL", [], "give at least one model")
    formats = {m.format for m in models}
    if len(formats) > 1:
        raise ConfigError("MODEL", sorted(formats), "give files of one format (GGUF or EXL2/EXL3)")
    target = max(models, key=lambda m: m.n_params)
    variants = [m for m in models if m.family == target.family]
    others = [m for m in models if m.family != target.family]
    drafts = [m for m in others if m.lineage == target.lineage and m.n_params < target.n_params]
    strangers = [m for m in others if m not in drafts]
    if strangers:
        raise ConfigError("MODEL", str(strangers[0].path), f"a different model than {target.title} "
                          "(another architecture or vocabulary); give the files of one model and at "
                          "most one smaller draft of the same family")
    if len({m.family for m in drafts}) > 1:
        raise ConfigError("MODEL", [str(m.path) for m in drafts], "more than one draft model; give one")
    named = _names(sorted(variants, key=lambda m: -m.bpw))
    draft = _names(sorted(drafts, key=lambda m: -m.bpw)[:1], "draft_")[0] if drafts else None
    first = next(v.name for v in named if v.path == (models[0] if models[0] in variants else target).path)
    return ModelSet(named, draft, first)
