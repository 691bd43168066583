"""Memory before launch (an estimate from GGUF metadata) and while running (peak RSS).

:func:`estimate_llamacpp_mb` reads only the GGUF header (:func:`read_gguf_metadata`; no
tensor data is read) and predicts what a llama.cpp process will hold resident:

- weights: the file size (llama.cpp maps the file and touches every tensor on CPU);
- KV cache: ``n_layers * n_ctx * n_kv_heads * (key_length * bytes(type_k) +
  value_length * bytes(type_v))``; every layer is counted at the full ``n_ctx`` (what
  llama.cpp allocates for gemma-3's sliding-window layers too, checked on 0.3.36);
- logits: ``n_vocab * 4`` bytes per output row, twice (llama.cpp's output buffer and
  llama-cpp-python's ``scores`` copy); one row, or ``n_ctx`` rows with ``logits_all``;
- a fixed runtime overhead (Python, llama.cpp, activations) of ``RUNTIME_MB``.

llama.cpp also reserves a compute buffer of about ``n_ubatch * n_vocab * 4`` bytes for
the worst-case batch of logits; only the rows a batch really produces become resident, so
it is reported separately as ``compute_reserved_mb`` and is not in ``total_mb``.
"""

from __future__ import annotations

import functools
import os
import resource
import struct
from pathlib import Path

MIB = 1024.0 * 1024.0
RUNTIME_MB = 80.0

# bytes per element of the KV cache types (ggml block size / block bytes)
KV_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
    "iq4_nl": 18 / 32,
}
KV_BLOCK = {t: 32 for t in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")}  # elements a block


def kv_type_refusal(shape: dict, type_k: str, type_v: str, flash_attn_off: bool) -> str | None:
    """Why llama.cpp refuses these KV cache types on this model, or None.

    ``llama_init_from_model`` (src/llama-context.cpp of the vendored llama.cpp): with flash
    attention on or auto, a quantized K or V cache whose block (32 elements) does not divide
    the head size fails the context ("V cache type q8_0 with block size 32 does not divide
    n_embd_head_v=16"); every real model's heads (64-256) are multiples of 32, tiny test
    models' need not be. A quantized V cache without flash attention is the engines' own check.
    """
    if flash_attn_off:
        return None
    for which, kind, size in (("K", type_k, shape["key_length"]), ("V", type_v, shape["value_length"])):
        block = KV_BLOCK.get(kind)
        if block and size % block:
            return (f"{which} cache type {kind} (blocks of {block}) does not divide this model's head "
                    f"size {size}: llama.cpp refuses the context")
    return None


def kv_types_for(shape: dict, types: tuple[str, ...] = ("f16", "q8_0", "q4_0")) -> tuple[list[str], str]:
    """The KV cache types of ``types`` llama.cpp takes on this model's heads (with flash
    attention), and, when some are left out, a line saying why (for ``autotune init``)."""
    kept = [t for t in types if kv_type_refusal(shape, t, t, False) is None]
    if len(kept) == len(types):
        return kept, ""
    heads = sorted({shape["key_length"], shape["value_length"]})
    return kept, (f"{', '.join(t for t in types if t not in kept)} left out: this model's heads "
                  f"({'/'.join(map(str, heads))} wide) are not a multiple of llama.cpp's quantized KV block "
                  f"({max(KV_BLOCK.values())}), which it refuses")


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")


def read_gguf_metadata(model_path: str | Path) -> dict:
    """The GGUF header's key/values; arrays are summarised as their length.

    A small reader of the GGUF v2/v3 layout instead of ``gguf.GGUFReader``: the latter
    builds Python objects for every vocabulary entry (262,144 for gemma-3), which took
    9 s and 700 MB of peak RSS inside the trial worker and so polluted ``peak_rss_mb``.
    This one skips array contents and reads only the metadata (milliseconds, no RSS).
    """
    return _read_header(model_path, tensors=False)[0]


def read_gguf_tensors(model_path: str | Path) -> dict[str, int]:
    """The GGUF tensor table: tensor name -> bytes of its data (from its shape and type).

    Only the header is read, so a header written without tensor data (a synthetic model's
    shape) is read as well as a whole file.
    """
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType

    out: dict[str, int] = {}
    for name, dims, ttype in _read_header(model_path, tensors=True)[1]:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        n = 1
        for d in dims:
            n *= d
        out[name] = n // block * size
    return out


def _read_header(model_path: str | Path, tensors: bool) -> tuple[dict, list[tuple]]:
    """(key/values, [(tensor name, dims, ggml type)] when ``tensors``) of a GGUF header."""
    import mmap

    with open(model_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"GGUF":
            raise ValueError(f"{model_path}: not a GGUF file (magic {bytes(m[:4])!r})")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", m, 4)
        if version < 2:
            raise ValueError(f"{model_path}: GGUF version {version} is not supported (need >= 2)")
        pos = 24

        def string(pos: int) -> tuple[str, int]:
            (n,) = struct.unpack_from("<Q", m, pos)
            return m[pos + 8 : pos + 8 + n].decode("utf-8", "replace"), pos + 8 + n

        def value(vtype: int, pos: int) -> tuple[object, int]:
            if vtype in _SCALARS:
                fmt = _SCALARS[vtype]
                return struct.unpack_from(fmt, m, pos)[0], pos + struct.calcsize(fmt)
            if vtype == _STRING:
                return string(pos)
            if vtype == _ARRAY:
                etype, count = struct.unpack_from("<IQ", m, pos)
                pos += 12
                if etype in _SCALARS:
                    size = struct.calcsize(_SCALARS[etype])
                    if count <= 64:
                        items = list(struct.unpack_from(f"<{count}{_SCALARS[etype][1]}", m, pos))
                        return items, pos + count * size
                    return ArrayLen(count), pos + count * size
                if etype == _STRING:  # a vocabulary: only each length is read (262,144 for gemma-3)
                    length = _U64.unpack_from
                    for _ in range(count):
                        pos += 8 + length(m, pos)[0]
                    return ArrayLen(count), pos
                for _ in range(count):
                    _, pos = value(etype, pos)
                return ArrayLen(count), pos
            raise ValueError(f"{model_path}: unknown GGUF value type {vtype}")

        out: dict = {}
        for _ in range(n_kv):
            key, pos = string(pos)
            (vtype,) = struct.unpack_from("<I", m, pos)
            out[key], pos = value(vtype, pos + 4)
        table: list[tuple] = []
        for _ in range(n_tensors if tensors else 0):
            name, pos = string(pos)
            (n_dims,) = struct.unpack_from("<I", m, pos)
            dims = struct.unpack_from(f"<{n_dims}Q", m, pos + 4)
            (ttype,) = struct.unpack_from("<I", m, pos + 4 + 8 * n_dims)
            table.append((name, dims, ttype))
            pos += 4 + 8 * n_dims + 4 + 8
        return out, table


class ArrayLen(int):
    """The length of a GGUF array whose contents were skipped."""


def _version(model_path: str | Path) -> tuple[str, int, int]:
    """A file version: its path as given, size and modification time (ns); one ``stat``
    (``Path.resolve`` cost more than the rest of a prediction)."""
    st = os.stat(model_path)
    return os.fspath(model_path), st.st_size, st.st_mtime_ns


def gguf_metadata(model_path: str | Path) -> dict:
    """:func:`read_gguf_metadata`, read once per file version (path, size, mtime): the pool
    of a search predicts thousands of configurations from one header (gemma-3's holds a
    262k-entry vocabulary, ~20 ms a read)."""
    return dict(_gguf_metadata(*_version(model_path)))


@functools.lru_cache(maxsize=64)
def _gguf_metadata(model_path: str, _size: int, _mtime_ns: int) -> dict:
    return read_gguf_metadata(model_path)


def gguf_shape(model_path: str | Path) -> dict:
    """Architecture numbers the estimate needs, read from a GGUF header (once per file
    version: a pre-launch prediction over thousands of configurations reads it once)."""
    return dict(_gguf_shape(*_version(model_path)))


@functools.lru_cache(maxsize=64)
def _gguf_shape(model_path: str, _size: int, _mtime_ns: int) -> dict:
    meta = _gguf_metadata(model_path, _size, _mtime_ns)
    arch = meta.get("general.architecture")
    if not arch:
        raise ValueError(f"{model_path}: no general.architecture in the GGUF metadata")

    def get(key: str, default=None):
        v = meta.get(f"{arch}.{key}", default)
        if isinstance(v, list):  # per-layer values in some architectures
            v = max(v)
        return v

    n_embd = int(get("embedding_length"))
    n_head = int(get("attention.head_count", 1))
    head_dim = n_embd // max(n_head, 1)
    n_vocab = get("vocab_size") or int(meta.get("tokenizer.ggml.tokens", 0))
    return {
        "arch": arch,
        "n_layers": int(get("block_count")),
        "n_embd": n_embd,
        "n_head": n_head,
        "n_head_kv": int(get("attention.head_count_kv", n_head)),
        "key_length": int(get("attention.key_length", head_dim)),
        "value_length": int(get("attention.value_length", head_dim)),
        "n_vocab": int(n_vocab),
        "n_ctx_train": int(get("context_length", 0)),
        **_sliding_window(meta, arch, int(get("block_count"))),
        "expert_count": int(get("expert_count", 0) or 0),
        "expert_used_count": int(get("expert_used_count", 0) or 0),
        # the stacked expert weights (``blk.N.ffn_*_exps``), from the tensor table (MoE only)
        "expert_bytes": sum(b for n, b in read_gguf_tensors(model_path).items() if "_exps" in n)
        if get("expert_count", 0) else 0,
    }


# Sliding-window attention: every n-th layer attends to the whole context, the others to the
# last ``{arch}.attention.sliding_window`` tokens. llama.cpp reads the pattern from
# ``{arch}.attention.sliding_window_pattern`` when the file has it, else from its own table
# (src/models/<arch>.cpp: ``load_swa_pattern(ml, n)``; layer il is SWA when il % n < n - 1).
# An architecture not here is sized as if every layer were global (an overestimate).
SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "gpt-oss": 2}
SWA_PAD = 256  # llama.cpp pads the SWA cache to 256 cells (llama-kv-cache-iswa.cpp)


def _sliding_window(meta: dict, arch: str, n_layers: int) -> dict:
    """``n_swa`` (the window, 0: none) and ``swa_layers`` (how many layers use it)."""
    n_swa = meta.get(f"{arch}.attention.sliding_window", 0)
    n_swa = int(max(n_swa) if isinstance(n_swa, list) else n_swa or 0)
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern", SWA_PATTERN.get(arch))
    if n_swa and isinstance(pattern, list):  # a flag per layer
        return {"n_swa": n_swa, "swa_layers": sum(map(bool, pattern[:n_layers]))}
    if not n_swa or type(pattern) is not int or pattern <= 0:  # (an ArrayLen is a skipped array)
        return {"n_swa": 0, "swa_layers": 0}
    return {"n_swa": n_swa, "swa_layers": sum(il % pattern < pattern - 1 for il in range(n_layers))}


def kv_cells(shape: dict, n_ctx: int, n_seq: int = 1, unified: bool = True, swa_full: bool = True,
             n_ubatch: int = 512, ctx_each: bool = True) -> tuple[int, int]:
    """(cells of a global layer, cells of a sliding-window layer) as llama.cpp allocates them
    for ``n_ctx`` (0: the training context) and ``n_seq`` sequences (llama-server's slots).

    A unified cache (``--kv-unified``; what llama-server's ``--parallel -1`` picks) is one
    stream of ``n_ctx`` cells; otherwise each of the ``n_seq`` streams holds ``n_ctx / n_seq``
    (when ``n_ctx`` is 0: the training context each if ``ctx_each``, llama-server's ``--fit on``,
    else a share of it). A sliding-window layer holds
    ``min(per stream, n_swa x (n_seq if unified else 1) + n_ubatch)`` cells, padded to 256,
    unless ``swa_full`` (llama-cpp-python's default; llama-server's ``--swa-full``).
    Checked against llama-server's own log on gemma-3 270M (tests/engines/test_llama_server.py).
    """
    n_seq = max(int(n_seq), 1)
    streams = 1 if unified else n_seq
    per_stream = n_ctx or shape["n_ctx_train"]
    if not unified and (n_ctx or not ctx_each):
        per_stream //= n_seq
    full = per_stream * streams
    if swa_full or not shape.get("n_swa"):
        return full, full
    window = min(per_stream, shape["n_swa"] * (n_seq if unified else 1) + n_ubatch)
    return full, -(-window // SWA_PAD) * SWA_PAD * streams


def kv_cache_mb(shape: dict, n_ctx: int, type_k: str, type_v: str, *, n_seq: int = 1,
                unified: bool = True, swa_full: bool = True, n_ubatch: int = 512,
                ctx_each: bool = True) -> float:
    """Size of the KV cache in MiB (:func:`kv_cells` per layer; every layer at ``n_ctx``
    cells by default)."""
    for name, t in (("type_k", type_k), ("type_v", type_v)):
        if t not in KV_BYTES:
            raise ValueError(f"{name}={t!r}: expected one of {', '.join(KV_BYTES)}")
    per_cell = shape["n_head_kv"] * (
        shape["key_length"] * KV_BYTES[type_k] + shape["value_length"] * KV_BYTES[type_v]
    )
    full, swa = kv_cells(shape, n_ctx, n_seq, unified, swa_full, n_ubatch, ctx_each)
    n_swa_layers = shape.get("swa_layers", 0)
    return ((shape["n_layers"] - n_swa_layers) * full + n_swa_layers * swa) * per_cell / MIB


def estimate_llamacpp_mb(
    model_path: str | Path,
    n_ctx: int,
    type_k: str = "f16",
    type_v: str = "f16",
    *,
    n_ubatch: int = 512,
    logits_all: bool = False,
    n_seq: int = 1,
    unified: bool = True,
    swa_full: bool = True,
    ctx_each: bool = True,
) -> dict:
    """Estimate llama.cpp's resident memory (MiB) before loading the model.

    Args:
        model_path: a GGUF file.
        n_ctx: context cells (0 means the model's training context, as llama.cpp does).
        type_k: KV cache key type (``f16``, ``q8_0``, ...).
        type_v: KV cache value type.
        n_ubatch: physical batch size (sizes the reserved compute buffer).
        logits_all: whether logits are kept for every position (prompt lookup, perplexity).
        n_seq, unified, swa_full, ctx_each: the KV cache's sequences (llama-server's slots),
            whether they share one stream, whether sliding-window layers hold the whole context
            and whether ``n_ctx`` 0 gives each stream the training context (:func:`kv_cells`;
            the defaults are llama-cpp-python's: one sequence, full size).

    Returns:
        ``weights_mb``, ``active_weights_mb`` (what one decoded token reads: the weights less
        the experts a mixture-of-experts model leaves unused), ``kv_mb``, ``logits_mb``, ``runtime_mb``, ``total_mb`` (their sum,
        the figure reported as ``mem_estimate_mb``), ``compute_reserved_mb`` (address
        space reserved, mostly not resident) and the architecture numbers used.
    """
    return dict(_estimate(*_version(model_path), int(n_ctx), type_k, type_v, n_ubatch, logits_all,
                          max(int(n_seq), 1), bool(unified), bool(swa_full), bool(ctx_each)))


@functools.lru_cache(maxsize=4096)
def _estimate(model_path: str, size: int, mtime_ns: int, n_ctx: int, type_k: str, type_v: str,
              n_ubatch: int, logits_all: bool, n_seq: int = 1, unified: bool = True,
              swa_full: bool = True, ctx_each: bool = True) -> dict:
    """:func:`estimate_llamacpp_mb` of one file version (a pool predicts thousands of
    configurations that differ only in knobs the estimate does not read)."""
    shape = dict(_gguf_shape(model_path, size, mtime_ns))
    asked, n_ctx = n_ctx, n_ctx or shape["n_ctx_train"]
    weights = size / MIB
    active = weights
    if shape["expert_count"] and shape["expert_used_count"] and shape["expert_bytes"]:
        idle = 1 - min(shape["expert_used_count"], shape["expert_count"]) / shape["expert_count"]
        active = weights - shape["expert_bytes"] * idle / MIB
    kv = kv_cache_mb(shape, asked, type_k, type_v, n_seq=n_seq, unified=unified, swa_full=swa_full,
                     n_ubatch=n_ubatch, ctx_each=ctx_each)
    rows = n_ctx if logits_all else 1
    logits = 2 * rows * shape["n_vocab"] * 4 / MIB
    compute = min(n_ubatch, n_ctx) * shape["n_vocab"] * 4 / MIB
    return {
        "weights_mb": weights,
        "active_weights_mb": active,
        "kv_mb": kv,
        "logits_mb": logits,
        "runtime_mb": RUNTIME_MB,
        "total_mb": weights + kv + logits + RUNTIME_MB,
        "compute_reserved_mb": compute,
        **shape,
        "n_ctx": n_ctx,
    }


def peak_rss_mb() -> float:
    """Peak resident set size of this process's own image so far, in MiB.

    Reads ``VmHWM`` from /proc/self/status. ``getrusage().ru_maxrss`` is wrong for a
    trial worker: Linux carries the high-water mark of the forked copy of the parent
    across ``exec``, so a worker started from a 1.1 GB pytest or driver process reported
    1157 MB instead of 380 MB. Falls back to ``ru_maxrss`` where /proc is missing.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
