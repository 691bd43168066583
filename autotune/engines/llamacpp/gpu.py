"""llama.cpp on CUDA: which flash-attention K/V cache pairs run fast, and GPU renumbering.

Flash attention (llama.cpp vendored by llama-cpp-python 0.3.36,
``ggml/src/ggml-cuda/fattn.cu::ggml_cuda_flash_attn_ext_vec``): the CUDA vector kernels are
compiled only for the K/V type pairs of ``GGML_CUDA_FA_QUANTS`` (``ggml/CMakeLists.txt``,
default ``q4_0-q4_0;q8_0-q8_0;f16-f16;bf16-bf16``; f32 runs as f16). Any other pair is not an
error: llama.cpp logs "no FlashAttention vector kernel compiled for K/V types ..., converting K
and V to f16 instead (slow)" and runs, so a tuner would measure a slow path the user never
meant. :func:`fa_pair_reasons` declares the rule; a build with ``-DGGML_CUDA_FA_ALL_QUANTS=ON``
says so with ``engine.settings.cuda_fa_all_quants: true``.

Renumbering: Ray gives a trial as many GPUs as ``tensor_split`` has non-zero entries and sets
``CUDA_VISIBLE_DEVICES``, so llama.cpp sees them as 0..n-1. :func:`visible_split` drops the zero
entries of a longer ``tensor_split`` and moves ``main_gpu`` to the same device's new index.

Failures: :func:`load_failure_reason` and :func:`decode_failure_reason` say which
llama-cpp-python errors mean "this configuration does not fit" (infeasible, pruned) and which
are real failures (a wrong model path must be seen, not pruned).
"""

from __future__ import annotations

import os
import re

# llama.h, llama_decode: 1 = no KV slot for the batch (context too small for it), -2 = the
# compute buffers could not be allocated (GGML_STATUS_ALLOC_FAILED: out of memory). Other codes
# (-1 invalid batch, -3 compute failed, 2 aborted) are real failures.
_DECODE = re.compile(r"llama_(?:decode|encode) returned (-?\d+)")
DECODE_INFEASIBLE = {1: "no KV cache slot for the batch (n_ctx too small)",
                     -2: "out of memory: llama.cpp could not allocate its compute buffers"}

FA_PAIRS_DEFAULT = frozenset({("f16", "f16"), ("q4_0", "q4_0"), ("q8_0", "q8_0"), ("bf16", "bf16")})


def _as_f16(t: str) -> str:
    return "f16" if t == "f32" else t


def fa_pair_reasons(p: dict, all_quants: bool = False) -> list[str]:
    """Why (type_k, type_v) would run llama.cpp's slow f16-conversion path on CUDA ([] if not).

    ``all_quants``: the build has every pair's kernel (``settings.cuda_fa_all_quants``)."""
    if not p.get("n_gpu_layers") or not p.get("flash_attn") or all_quants:
        return []
    pair = (_as_f16(str(p.get("type_k", "f16"))), _as_f16(str(p.get("type_v", "f16"))))
    if pair in FA_PAIRS_DEFAULT:
        return []
    allowed = ", ".join(sorted(f"{k}/{v}" for k, v in FA_PAIRS_DEFAULT))
    return [f"type_k={p.get('type_k')} with type_v={p.get('type_v')}: llama.cpp's CUDA flash attention "
            f"has kernels only for {allowed} (GGML_CUDA_FA_QUANTS) and converts other pairs to f16 "
            "(slow); set engine.settings.cuda_fa_all_quants: true for a -DGGML_CUDA_FA_ALL_QUANTS=ON build"]


def visible_count(env: dict | None = None) -> int | None:
    """How many devices ``CUDA_VISIBLE_DEVICES`` lists; None when it is unset."""
    value = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return len([x for x in value.split(",") if x.strip()])


def visible_split(tensor_split: list | None, main_gpu: int, n_visible: int | None) -> tuple[list | None, int, str]:
    """(tensor_split, main_gpu, note) in the numbering of the trial's visible devices.

    Raises ValueError when the split needs more devices than are visible.
    """
    if n_visible is None:
        return tensor_split, main_gpu, ""
    split = list(tensor_split) if tensor_split else None
    note = ""
    if split and len(split) > n_visible:
        kept = [i for i, x in enumerate(split) if x]
        if len(kept) > n_visible:
            raise ValueError(f"tensor_split {split} uses {len(kept)} GPUs; {n_visible} are visible to the trial")
        new_main = kept.index(main_gpu) if main_gpu in kept else 0
        note = (f"tensor_split {split} and main_gpu {main_gpu} renumbered to {[split[i] for i in kept]} "
                f"and {new_main} for the {n_visible} visible GPU(s)")
        split, main_gpu = [split[i] for i in kept], new_main
    if main_gpu >= max(n_visible, 1):
        note = (note + "; " if note else "") + f"main_gpu {main_gpu} is not visible: using 0"
        main_gpu = 0
    return split, main_gpu, note


def load_failure_reason(exc: BaseException, gpu_offload: bool) -> str | None:
    """Why ``llama_cpp.Llama(...)`` failing means an infeasible configuration; None if real.

    llama-cpp-python 0.3.36 raises ValueError for everything (``_internals.py``): "Model path
    does not exist" and "Failed to get vocab" are real failures; "Failed to create
    llama_context" is the context's buffers not fitting (n_ctx, n_batch, KV type); "Failed to
    load model from file" is infeasible only with GPU offload (the weights' GPU buffers).
    """
    text = str(exc)
    if not isinstance(exc, ValueError) or "does not exist" in text or "Failed to get vocab" in text:
        return None
    if "Failed to create llama_context" in text or ("Failed to load model" in text and gpu_offload):
        return f"llama.cpp rejected the configuration: {text}"
    return None


def decode_failure_reason(exc: BaseException) -> str | None:
    """Why a ``llama_decode returned N`` error during generation is infeasible; None if real."""
    m = _DECODE.search(str(exc))
    if m is None or int(m.group(1)) not in DECODE_INFEASIBLE:
        return None
    return f"{DECODE_INFEASIBLE[int(m.group(1))]} ({m.group(0)})"
