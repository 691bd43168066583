"""Before a trial launches: does its configuration fit, and how fast can it decode at most?

Each engine's ``predict`` classmethod (``Engine.predict(params, settings, variants)``)
returns a :class:`Prediction`. The driver records a configuration predicted not to fit as
infeasible with ``reason`` ("predicted OOM: needs 31.2 GB on GPU 1 of 24.0") and never
launches it (``study.precheck: false`` turns this off), and it orders its start-up design
by ``decode_tps_upper``.

The estimates (docs/predict.md):

- memory per device = weights resident there + KV cache at the full context
  (``n_ctx`` / ``max_seq_len`` / ``max_model_len``) in its cache type + draft model and its
  cache + a fixed runtime overhead; compared with each GPU's ``memory_gb`` (from
  ``engine.settings.gpus`` or NVML) or, on CPU, with ``MemAvailable``;
- decode upper bound = 1 / sum over devices of (bytes read per token there / that
  device's memory bandwidth): every weight is read once per generated token, so no engine
  can beat it. With a draft model, the bound assumes every drafted token is accepted.

Bandwidths come from ``engine.settings.memory_bandwidth_gbps`` (RAM) and
``engine.settings.gpus[i].bandwidth_gbps``, else a table of known GPUs, else (RAM) a
quick multi-threaded numpy read probe cached in ``~/.cache/autotune/bandwidth.json``
(:mod:`autotune.engines.roofline`, which also turns a prediction's ``reads`` into the
roofline at the workload's context).
GB here are GiB (2**30 bytes): the unit of a card's "24 GB".
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune._expr import compile_expr
from autotune._files import write_atomic
from autotune.engines.roofline import READ_PROBE
from autotune.engines.roofline import DeviceRead
from autotune.engines.roofline import probe_ram_read_gbps
from autotune.errors import ConfigError
from autotune.errors import unknown_name
from autotune.hardware import list_gpus

GIB = float(1 << 30)
PREDICT_KEYS = ("let", "need_gb", "have_gb", "decode_tps_upper", "expect")
GPU_OVERHEAD_GB = 0.5  # CUDA context + allocator slack per GPU
GPU_BANDWIDTH_GBPS = {  # spec-sheet memory bandwidth (GB/s, 1e9), longest name matched first
    "RTX 5090": 1792, "RTX 4090": 1008, "RTX 4080": 717, "RTX 4070 Ti": 504, "RTX 4070": 504,
    "RTX 3090 Ti": 1008, "RTX 3090": 936, "RTX 3080": 760, "GTX 1080 Ti": 484, "GTX 1080": 320,
    "A100": 2039, "H100": 3350, "H200": 4800, "L40S": 864, "RTX A6000": 768, "RTX 6000 Ada": 960,
}
# HF-style shapes of common models, for an EXL2 / HF directory that is not on this machine.
KNOWN_SHAPES = {
    "70b": {"n_params": 70.6e9, "n_layers": 80, "n_kv_heads": 8, "head_dim": 128, "hidden": 8192},
    "8b": {"n_params": 8.03e9, "n_layers": 32, "n_kv_heads": 8, "head_dim": 128, "hidden": 4096},
    "3b": {"n_params": 3.21e9, "n_layers": 28, "n_kv_heads": 8, "head_dim": 128, "hidden": 3072},
    "1b": {"n_params": 1.24e9, "n_layers": 16, "n_kv_heads": 8, "head_dim": 64, "hidden": 2048},
}
EXL2_CACHE_BYTES = {"FP16": 2.0, "Q8": 1.0 + 1 / 32, "Q6": 0.75 + 1 / 32, "Q4": 0.5 + 1 / 32}


@dataclass(frozen=True)
class Prediction:
    """What is known before launch. ``fits`` None: unknown; ``need_gb``/``have_gb`` per device."""

    fits: bool | None = None
    reason: str = ""
    need_gb: tuple[float, ...] = ()
    have_gb: tuple[float, ...] = ()
    decode_tps_upper: float | None = None
    reads: tuple[DeviceRead, ...] = ()  # bytes a decoded token reads per device (roofline.py)
    expect: tuple[tuple[str, float], ...] = ()  # (metric, expected value): a constraint's prior

    def stored(self) -> dict[str, Any] | None:
        """What a launched trial keeps of it (its ``prediction`` user attribute, read back by
        the summary, the report and the roofline); None when nothing is known."""
        reads, expect = [r.to_dict() for r in self.reads], dict(self.expect)
        if not (self.need_gb or reads or self.decode_tps_upper is not None or expect):
            return None
        out = {"need_gb": list(self.need_gb), "have_gb": list(self.have_gb),
               "decode_tps_upper": self.decode_tps_upper, "reads": reads}
        return {**out, "expect": expect} if expect else out

    @classmethod
    def from_stored(cls, data: dict[str, Any] | None) -> Prediction | None:
        """The prediction a launched trial kept (:meth:`stored`), back as a record; ``fits`` and
        ``reason`` are not kept (a launched trial was predicted to fit or not known not to)."""
        if data is None:
            return None
        return cls(need_gb=tuple(data.get("need_gb") or ()), have_gb=tuple(data.get("have_gb") or ()),
                   decode_tps_upper=data.get("decode_tps_upper"),
                   reads=tuple(DeviceRead.from_dict(r) for r in data.get("reads") or ()),
                   expect=tuple((data.get("expect") or {}).items()))


def verdict(need: list[float], have: list[float], labels: list[str] | None = None,
            decode_tps_upper: float | None = None, reads: tuple[DeviceRead, ...] = ()) -> Prediction:
    """A Prediction from per-device needs and capacities (the first device that overflows
    names the reason: "predicted OOM: needs 31.2 GB on GPU 1 of 24.0")."""
    labels = labels or [f"GPU {i}" for i in range(len(need))]
    fits, reason = True, ""
    for label, n, h in zip(labels, need, have):
        if h is not None and n > h:
            fits, reason = False, f"predicted OOM: needs {n:.1f} GB on {label} of {h:.1f}"
            break
    if fits and (len(have) < len(need) or any(h is None for h in have)):
        fits = None  # a device whose capacity is unknown
    return Prediction(fits, reason, tuple(round(x, 3) for x in need),
                      tuple(round(x, 3) for x in have if x is not None), decode_tps_upper, tuple(reads))


def compare(pred: Prediction, metrics: dict[str, float]) -> dict[str, float]:
    """Estimate vs measurement: ``mem_pred_error_pct`` (sum of need vs measured peak VRAM or
    RSS) and ``decode_bound_ratio`` (measured decode_tps / upper bound; > 1 means the bound
    was wrong)."""
    out: dict[str, float] = {}
    measured = None
    if math.isfinite(metrics.get("vram_peak_gb", math.nan)):
        measured = metrics["vram_peak_gb"]
    elif math.isfinite(metrics.get("peak_rss_mb", math.nan)):
        measured = metrics["peak_rss_mb"] / 1024.0
    if pred.need_gb and measured:
        out["mem_pred_error_pct"] = 100.0 * (sum(pred.need_gb) - measured) / measured
    tps = metrics.get("decode_tps")
    if pred.decode_tps_upper and tps and math.isfinite(tps):
        out["decode_bound_ratio"] = tps / pred.decode_tps_upper
    return out


def as_dict(settings: Any) -> dict:
    """Engine settings as a plain mapping (a dict, or a settings dataclass)."""
    if settings is None:
        return {}
    if isinstance(settings, dict):
        return settings
    if dataclasses.is_dataclass(settings):
        return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
    return dict(settings)


# ---- capacities and bandwidths --------------------------------------------------------------
def ram_available_gb() -> float | None:
    """MemAvailable from /proc/meminfo (GiB); None (unknown) where there is no /proc."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return None


def gpu_table(settings: dict) -> list[dict]:
    """[{name, memory_gb, bandwidth_gbps, bandwidth_source}] from settings.gpus, else NVML
    (empty if none); a bandwidth not in the settings is the spec sheet's (GPU_BANDWIDTH_GBPS)."""
    gpus = [g if isinstance(g, dict) else as_dict(g) for g in as_dict(settings).get("gpus") or []]
    gpus = [dict(g) for g in gpus]
    if not gpus:

        gpus = [{"name": g.name, "memory_gb": g.memory_gb} for g in list_gpus()]  # GiB
    for g in gpus:
        g["bandwidth_source"] = "settings" if g.get("bandwidth_gbps") else "spec sheet"
        if not g.get("bandwidth_gbps"):
            name = str(g.get("name", ""))
            match = max((k for k in GPU_BANDWIDTH_GBPS if k.lower() in name.lower()), key=len, default=None)
            g["bandwidth_gbps"] = GPU_BANDWIDTH_GBPS.get(match) if match else None
    return gpus


def _bandwidth_cache() -> Path:
    root = os.environ.get("AUTOTUNE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "autotune")
    return Path(root) / "bandwidth.json"


def ram_bandwidth_gbps(settings: dict) -> float:
    """``settings.memory_bandwidth_gbps``, else the cached read probe (measured once per machine)."""
    settings = as_dict(settings)
    if settings.get("memory_bandwidth_gbps"):
        return float(settings["memory_bandwidth_gbps"])
    path = _bandwidth_cache()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if isinstance(cached, dict) and "ram_read_gbps" in cached:
        return float(cached["ram_read_gbps"])
    value = probe_ram_read_gbps()  # none yet, or an older copy probe's file: its keys are kept
    keep = cached if isinstance(cached, dict) else {}
    write_atomic(path, json.dumps({**keep, "ram_read_gbps": value, "read_probe": READ_PROBE}))
    return value


def ram_bandwidth_source(settings: dict) -> str:
    """Where :func:`ram_bandwidth_gbps` comes from: the settings, or the read probe."""
    return "settings" if as_dict(settings).get("memory_bandwidth_gbps") else "read probe"


def decode_bound(bytes_per_device: list[tuple[float, float | None]]) -> float | None:
    """Tokens/s upper bound from (bytes read per token, bandwidth GB/s) of sequential devices."""
    seconds = 0.0
    for nbytes, bw in bytes_per_device:
        if nbytes <= 0:
            continue
        if not bw:
            return None
        seconds += nbytes / (bw * 1e9)
    return 1.0 / seconds if seconds > 0 else None


def fill_manual(split: list[float], total: float) -> list[float]:
    """Share of ``total`` GB on each GPU of a manual split: GPU 0 up to its GB, then the next."""
    left, share = 1.0, []
    for s in split:
        take = min(left, s / total)
        share.append(take)
        left -= take
    return share


def fill_auto(model: float, free: list[float]) -> list[float]:
    """Share of ``model`` GB on each GPU when auto-split fills each in order up to ``free`` GB;
    what does not fit lands on the last (the prediction then says OOM there)."""
    left, share = model, []
    for f in free:
        take = max(0.0, min(left, f))
        share.append(take / model)
        left -= take
    share[-1] += left / model
    return share


def split_decode_bound(weights_gb: float, share: list[float], bws: list[float | None],
                       tensor_parallel: bool) -> float | None:
    """Tokens/s bound of weights split by ``share``: GPUs read their parts in parallel under
    tensor parallelism (the slowest part bounds), one after the other otherwise."""
    parts = [(weights_gb * GIB * s, bw) for s, bw in zip(share, bws)]
    if not tensor_parallel:
        return decode_bound(parts)
    t = max((n / (bw * 1e9) if bw else float("inf")) for n, bw in parts)
    return 1.0 / t if 0 < t < float("inf") else None


# ---- kind: command ------------------------------------------------------------------------
def validate_command_predict(spec: Any, known: list[str], path: str) -> None:
    """Check ``engine.settings.predict`` at load: its keys and every expression's names."""
    if spec is None:
        return
    if not isinstance(spec, dict):
        raise ConfigError(path, spec, "expected {need_gb: EXPR | [EXPR, ...], have_gb: ..., "
                          "decode_tps_upper: EXPR}")
    known = list(known)
    let = spec.get("let") or {}
    if not isinstance(let, dict):
        raise ConfigError(f"{path}.let", let, "expected a mapping NAME: EXPR (each may use the ones above)")
    for name, text in let.items():
        if not str(name).isidentifier() or name in known:
            raise ConfigError(f"{path}.let.{name}", name, "a new identifier, not a knob or var name")
        compile_expr(text, known, f"{path}.let.{name}")
        known.append(name)
    for key, value in spec.items():
        if key not in PREDICT_KEYS:
            raise unknown_name(f"{path}.{key}", key, PREDICT_KEYS, "key")
        if key == "let":
            continue
        if key == "expect":
            _validate_expect(value, known, f"{path}.expect")
            continue
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            _check_value(item, known, f"{path}.{key}" + (f"[{i}]" if isinstance(value, list) else ""))
    if ("need_gb" in spec) != ("have_gb" in spec):
        raise ConfigError(path, spec, "need_gb and have_gb go together (one number or expression "
                          "per device)")


def _validate_expect(spec: Any, known: list[str], path: str) -> None:
    if not isinstance(spec, dict) or not spec:
        raise ConfigError(path, spec, "expected a mapping METRIC: EXPR (what the user expects a "
                          "constrained metric to read, e.g. ppl_delta_pct)")
    for metric, text in spec.items():
        if not str(metric).isidentifier():
            raise ConfigError(f"{path}.{metric}", metric, "a metric name")
        _check_value(text, known, f"{path}.{metric}")


def _check_value(item: Any, known: list[str], path: str) -> None:
    """A number, or an expression over ``known`` names (compiled, so a bad one fails at load)."""
    if not isinstance(item, (int, float)) or isinstance(item, bool):
        compile_expr(item, known, path)


@functools.lru_cache(maxsize=512)
def _compiled(text: str, known: tuple[str, ...], path: str):
    return compile_expr(text, known, path)


def _values(value: Any, env: dict, known: list[str], path: str) -> list[float]:
    items = value if isinstance(value, list) else [value]
    out = []
    for i, item in enumerate(items):
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            out.append(float(item))
        else:
            out.append(float(_compiled(item, tuple(known), f"{path}[{i}]")(env)))
    return out


def predict_command(params: dict, settings: dict, variants: dict | None = None) -> Prediction:
    """The user's declared prediction, evaluated over the knobs (defaults filled in), vars
    and the ``let`` helpers (evaluated in order). The command engine's ``predictor``."""
    settings = as_dict(settings)
    spec = settings.get("predict")
    if not spec:
        return Prediction()
    env = {**(settings.get("vars") or {}), **(settings.get("defaults") or {}),
           **{k: v for k, v in params.items() if v is not None}}
    known = sorted(set(settings.get("knobs") or {}) | set(settings.get("vars") or {}))
    try:
        for name, text in (spec.get("let") or {}).items():
            env[name] = _compiled(text, tuple(known), f"engine.settings.predict.let.{name}")(env)
            known.append(name)
        upper = None
        if "decode_tps_upper" in spec:
            upper = _values(spec["decode_tps_upper"], env, known, "engine.settings.predict.decode_tps_upper")[0]
        expect = tuple((str(m), _values(text, env, known, f"engine.settings.predict.expect.{m}")[0])
                       for m, text in (spec.get("expect") or {}).items())
        if "need_gb" not in spec:
            return Prediction(decode_tps_upper=upper, expect=expect)
        need = _values(spec["need_gb"], env, known, "engine.settings.predict.need_gb")
        have = _values(spec["have_gb"], env, known, "engine.settings.predict.have_gb")
    except (TypeError, ValueError, ZeroDivisionError, IndexError, KeyError) as e:
        return Prediction(reason=f"prediction not evaluated: {type(e).__name__}: {e}")
    if len(have) == 1 and len(need) > 1:
        have = have * len(need)
    labels = [f"GPU {i}" for i in range(len(need))] if len(need) > 1 else ["the device"]
    return dataclasses.replace(verdict(need, have, labels, upper), expect=expect)


# ---- fake engine -------------------------------------------------------------------------
def predict_fake(params: dict, settings: dict, variants: dict | None = None) -> Prediction:
    """The fake engine needs ``gpu_memory_gb`` on each of its ``gpus`` (fake) GPUs (its
    ``predictor``)."""
    settings = as_dict(settings)
    gpus = [as_dict(g) for g in settings.get("gpus") or []]
    want = float(params.get("gpu_memory_gb") or 0.0)
    n = int(params.get("gpus") or 0)
    if not gpus or not want or not n:
        return Prediction()
    biggest = sorted(gpus, key=lambda g: -float(g.get("memory_gb", 0)))[:n]
    have = [float(g.get("memory_gb", 0)) for g in biggest]
    return verdict([want] * len(have), have)


def _text_config(cfg_path: Path) -> dict | None:
    """The language model's part of a HF ``config.json`` (multimodal ones nest it under
    ``text_config``), or None when the file is missing, unreadable or lacks the shape."""
    try:
        c = json.loads(cfg_path.read_text())
    except (OSError, ValueError):
        return None
    for part in (c, c.get("text_config") if isinstance(c, dict) else None):
        if isinstance(part, dict) and {"hidden_size", "num_hidden_layers"} <= part.keys():
            return part
    return None


def hf_shape(variant: dict) -> dict | None:
    """n_params, n_layers, n_kv_heads, head_dim, hidden of a model directory (or a known shape)."""
    path = Path(os.path.expanduser(str(variant.get("path", ""))))
    cfg_path = path / "config.json"
    c = _text_config(cfg_path)
    if c is not None:
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


def kv_gb(shape: dict, tokens: int, bytes_per_elem: float) -> float:
    return 2 * shape["n_layers"] * shape["n_kv_heads"] * shape["head_dim"] * tokens * bytes_per_elem / GIB
