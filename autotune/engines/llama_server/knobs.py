"""llama-server's tunable flags, spelled as llama-server spells them, and its own defaults.

A knob's name is its long flag without the dashes, ``-`` written ``_`` (``--threads-batch``
is ``threads_batch``). :data:`FLAGS` says how each value is rendered: ``value`` (``--flag
V``), ``switch`` (a bool: ``--flag`` / ``--no-flag``) or ``variant`` (a model variant name,
rendered as its file's path). :func:`server_defaults` is what llama-server uses when the flag
is not given, read from its ``--help`` of llama.cpp as vendored in llama-cpp-python 0.3.36
(tests/engines/test_llama_server.py checks both tables against the built binary's ``--help``).
"""

from __future__ import annotations

import re
from typing import Any

from autotune.engines.base import Knob
from autotune.hardware import cpu_count

KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
UNQUANTIZED_KV = ("f32", "f16", "bf16")

# knob -> (flag, rendering)
FLAGS: dict[str, tuple[str, str]] = {
    "threads": ("--threads", "value"),
    "threads_batch": ("--threads-batch", "value"),
    "ctx_size": ("--ctx-size", "value"),
    "batch_size": ("--batch-size", "value"),
    "ubatch_size": ("--ubatch-size", "value"),
    "parallel": ("--parallel", "value"),
    "cont_batching": ("--cont-batching", "switch"),
    "kv_unified": ("--kv-unified", "switch"),
    "cache_reuse": ("--cache-reuse", "value"),
    "cache_ram": ("--cache-ram", "value"),
    "flash_attn": ("--flash-attn", "value"),
    "cache_type_k": ("--cache-type-k", "value"),
    "cache_type_v": ("--cache-type-v", "value"),
    "threads_http": ("--threads-http", "value"),
    "poll": ("--poll", "value"),
    "load_mode": ("--load-mode", "value"),
    "n_gpu_layers": ("--n-gpu-layers", "value"),
    "split_mode": ("--split-mode", "value"),
    "model_draft": ("--model-draft", "variant"),
    "spec_draft_n_max": ("--spec-draft-n-max", "value"),
    "spec_draft_n_min": ("--spec-draft-n-min", "value"),
    "spec_type": ("--spec-type", "value"),
}

KNOBS: dict[str, Knob] = {
    "model": Knob("str", doc="model variant name (engine.variants), --model"),
    "threads": Knob("int", low=-1, high=512, spelling="--threads / -t"),
    "threads_batch": Knob("int", low=-1, high=512, spelling="--threads-batch / -tb"),
    "ctx_size": Knob("int", low=0, high=1 << 20, spelling="--ctx-size / -c (0: the model's)"),
    "batch_size": Knob("int", low=1, high=65536, spelling="--batch-size / -b"),
    "ubatch_size": Knob("int", low=1, high=65536, spelling="--ubatch-size / -ub"),
    "parallel": Knob("int", low=-1, high=256, spelling="--parallel / -np (-1: auto)"),
    "cont_batching": Knob("bool", spelling="--cont-batching / --no-cont-batching"),
    "kv_unified": Knob("bool", spelling="--kv-unified / --no-kv-unified"),
    "cache_reuse": Knob("int", low=0, high=1 << 20, spelling="--cache-reuse"),
    "cache_ram": Knob("int", low=-1, high=1 << 20, spelling="--cache-ram (MiB, -1: no limit)"),
    "flash_attn": Knob("str", ("on", "off", "auto"), spelling="--flash-attn / -fa"),
    "cache_type_k": Knob("str", KV_TYPES, spelling="--cache-type-k / -ctk"),
    "cache_type_v": Knob("str", KV_TYPES, spelling="--cache-type-v / -ctv"),
    "threads_http": Knob("int", low=-1, high=512, spelling="--threads-http"),
    "poll": Knob("int", low=0, high=100, spelling="--poll"),
    "load_mode": Knob("str", ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio"),
                      spelling="--load-mode / -lm (replaces --no-mmap and --mlock)"),
    "n_gpu_layers": Knob("str", doc="auto, all or a number", spelling="--n-gpu-layers / -ngl"),
    "split_mode": Knob("str", ("none", "layer", "row", "tensor"), spelling="--split-mode / -sm"),
    "model_draft": Knob("str", doc="a variant name: the draft model", spelling="--model-draft / -md"),
    "spec_draft_n_max": Knob("int", low=0, high=256, spelling="--spec-draft-n-max (--draft-max)"),
    "spec_draft_n_min": Knob("int", low=0, high=256, spelling="--spec-draft-n-min (--draft-min)"),
    "spec_type": Knob("str", doc="none, ngram-simple, ...", spelling="--spec-type"),
}


def server_defaults(n_cpus: int | None = None) -> dict[str, Any]:
    """What llama-server uses for each knob when the flag is not given.

    ``threads`` is llama.cpp's ``cpu_get_num_math()`` (the cores; on a VM the affinity count),
    ``ctx_size`` 0 means the model's training context, ``parallel`` -1 means auto (4 slots
    with a unified KV cache: ``kv_unified`` follows ``parallel == -1`` unless set), ``n_gpu_layers`` auto offloads what fits (none without a GPU).
    """
    n = n_cpus or cpu_count()
    return {
        "threads": n, "threads_batch": n, "ctx_size": 0, "batch_size": 2048, "ubatch_size": 512,
        "parallel": -1, "cont_batching": True, "kv_unified": True, "cache_reuse": 0,
        "cache_ram": 8192, "flash_attn": "auto", "cache_type_k": "f16", "cache_type_v": "f16",
        "threads_http": -1, "poll": 50, "load_mode": "auto", "n_gpu_layers": "auto",
        "split_mode": "layer", "model_draft": None, "spec_draft_n_max": 3,
        "spec_draft_n_min": 0, "spec_type": "none",
    }


DESC_COLUMN = 40  # where --help starts an entry's description


def _head(line: str) -> str:
    """The flag part of a ``--help`` line (the description starts at column 40)."""
    if len(line) > DESC_COLUMN and line[DESC_COLUMN - 2:DESC_COLUMN] == "  ":
        return line[:DESC_COLUMN]
    return line


def help_flags(help_text: str) -> set[str]:
    """Every flag spelling a ``llama-server --help`` text lists (``-t``, ``--threads``, ...)."""
    out: set[str] = set()
    for line in help_text.splitlines():
        head = _head(line)
        if head.startswith("-"):
            out.update(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", head))
    return out


def help_defaults(help_text: str) -> dict[str, str]:
    """flag -> the ``(default: X)`` its ``--help`` entry states (long spellings, quotes removed).

    An entry starts at a line beginning with ``-`` and runs over its indented continuation
    lines, which are joined before the default is read.
    """
    entries: list[list[str]] = []
    for line in help_text.splitlines():
        if line.startswith("-"):
            entries.append([line])
        elif entries and line.startswith(" "):
            entries[-1].append(line.strip())
    out: dict[str, str] = {}
    for entry in entries:
        head = _head(entry[0])
        text = " ".join([entry[0][len(head):].strip(), *entry[1:]])
        m = re.search(r"default: ([^)]*)\)", text)
        if m:
            for flag in re.findall(r"(?<![\w-])(--[a-zA-Z][\w-]*)", head):
                out.setdefault(flag, m.group(1).strip().strip("'"))
    return out
