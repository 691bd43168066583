"""llama-server's tunable flags, spelled as llama-server spells them, and its own defaults.

A knob's name is its long flag without the dashes, ``-`` written ``_`` (``--threads-batch``
is ``threads_batch``). :data:`FLAGS` says how each value is rendered: ``value`` (``--flag
V``), ``switch`` (a bool: ``--flag`` / ``--no-flag``) or ``variant`` (a model variant name,
rendered as its file's path), ``flag`` (a bool given only when true: ``--cpu-moe``) or
``placement`` (a named ``--override-tensor`` placement: :data:`PLACEMENTS`, rendered by
:func:`placement_override`). :func:`server_defaults` is what llama-server uses when the flag
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
    "spec_draft_p_min": ("--spec-draft-p-min", "value"),
    "spec_ngram_simple_size_n": ("--spec-ngram-simple-size-n", "value"),
    "spec_ngram_simple_size_m": ("--spec-ngram-simple-size-m", "value"),
    "spec_ngram_simple_min_hits": ("--spec-ngram-simple-min-hits", "value"),
    "spec_ngram_mod_n_match": ("--spec-ngram-mod-n-match", "value"),
    "spec_ngram_mod_n_min": ("--spec-ngram-mod-n-min", "value"),
    "spec_ngram_mod_n_max": ("--spec-ngram-mod-n-max", "value"),
    "n_cpu_moe": ("--n-cpu-moe", "value"),
    "cpu_moe": ("--cpu-moe", "flag"),
    "override_tensor": ("--override-tensor", "placement"),
    "tensor_split": ("--tensor-split", "value"),
    "main_gpu": ("--main-gpu", "value"),
    "fit": ("--fit", "value"),
    "fit_target": ("--fit-target", "value"),
    "fit_ctx": ("--fit-ctx", "value"),
}

# llama.cpp's expert tensors (LLM_FFN_EXPS_REGEX of common/common.h): what --cpu-moe and
# --n-cpu-moe move to the CPU
EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
# the named --override-tensor placements: experts on the CPU for ...
PLACEMENTS = {
    "none": "no override",
    "exps_odd": "the odd-numbered layers (interleaved: every other layer's experts)",
    "exps_up_down": "every layer's up and down experts (the gate experts stay on the GPU)",
    "exps_last_<N>": "the last N layers (--n-cpu-moe takes the first N)",
}
PLACEMENT_PATTERN = r"none|exps_odd|exps_up_down|exps_last_\d+"
SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
              "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
_SPEC_ONE = "|".join(re.escape(t) for t in SPEC_TYPES)


def placement_override(name: str, n_layers: int | None) -> str | None:
    """The ``--override-tensor`` value of a named placement (None for ``none`` or no layer).

    ``exps_last_<N>`` needs the model's layer count (``n_layers``): llama.cpp's patterns
    name layers by index, as ``--n-cpu-moe`` does for the first N; without it (a variant not
    made yet, in a dry run's launch line) the layers are written ``<last N>``.
    """
    if name == "none":
        return None
    if name == "exps_odd":
        return r"blk\.\d*[13579]" + EXPS_REGEX + "=CPU"
    if name == "exps_up_down":
        return r"\.ffn_(up|down)_(ch|)exps=CPU"
    n = int(name.removeprefix("exps_last_"))
    if n_layers is None:
        return rf"blk\.(<last {n}>)" + EXPS_REGEX + "=CPU"
    layers = range(max(n_layers - n, 0), n_layers)
    if not layers:
        return None
    return r"blk\.(" + "|".join(map(str, layers)) + ")" + EXPS_REGEX + "=CPU"


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
    "spec_type": Knob("str", doc="a comma-separated list of " + ", ".join(SPEC_TYPES),
                      spelling="--spec-type", pattern=f"({_SPEC_ONE})(,({_SPEC_ONE}))*"),
    "spec_draft_p_min": Knob("float", low=0.0, high=1.0,
                             spelling="--spec-draft-p-min (--draft-p-min)"),
    "spec_ngram_simple_size_n": Knob("int", low=1, high=1024,
                                     spelling="--spec-ngram-simple-size-n"),
    "spec_ngram_simple_size_m": Knob("int", low=1, high=1024,
                                     spelling="--spec-ngram-simple-size-m"),
    "spec_ngram_simple_min_hits": Knob("int", low=1, high=1024,
                                       spelling="--spec-ngram-simple-min-hits"),
    "spec_ngram_mod_n_match": Knob("int", low=1, high=1024, spelling="--spec-ngram-mod-n-match"),
    "spec_ngram_mod_n_min": Knob("int", low=0, high=1024, spelling="--spec-ngram-mod-n-min"),
    "spec_ngram_mod_n_max": Knob("int", low=1, high=1024, spelling="--spec-ngram-mod-n-max"),
    "n_cpu_moe": Knob("int", low=0, high=4096,
                      spelling="--n-cpu-moe / -ncmoe (experts of the first N layers on the CPU)"),
    "cpu_moe": Knob("bool", spelling="--cpu-moe / -cmoe (every expert on the CPU)"),
    "override_tensor": Knob("str", pattern=PLACEMENT_PATTERN, spelling="--override-tensor / -ot",
                            doc="one of none, exps_odd, exps_up_down or exps_last_<N>"),
    "tensor_split": Knob("str", pattern=r"(\d+(\.\d+)?(,\d+(\.\d+)?)*)?",
                         spelling="--tensor-split / -ts",
                         doc="comma-separated proportions per GPU, e.g. 3,1 (empty: by free "
                             "memory)"),
    "main_gpu": Knob("int", low=0, high=63, spelling="--main-gpu / -mg"),
    "fit": Knob("str", ("on", "off"),
                spelling="--fit (llama.cpp fits unset arguments to free memory)"),
    "fit_target": Knob("int", low=0, high=1 << 20,
                       spelling="--fit-target (MiB left free per device)"),
    "fit_ctx": Knob("int", low=0, high=1 << 20,
                    spelling="--fit-ctx (smallest context --fit may set)"),
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
        "spec_draft_n_min": 0, "spec_type": "none", "spec_draft_p_min": 0.0,
        "spec_ngram_simple_size_n": 12, "spec_ngram_simple_size_m": 48,
        "spec_ngram_simple_min_hits": 1, "spec_ngram_mod_n_match": 24, "spec_ngram_mod_n_min": 48,
        "spec_ngram_mod_n_max": 64, "n_cpu_moe": 0, "cpu_moe": False, "override_tensor": "none",
        "tensor_split": "", "main_gpu": 0, "fit": "on", "fit_target": 1024, "fit_ctx": 4096,
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
        m = re.search(r"default: ([^()]*)[()]", text)  # "(default: X)", "default: X (env: ..."
        if m:
            for flag in re.findall(r"(?<![\w-])(--[a-zA-Z][\w-]*)", head):
                out.setdefault(flag, m.group(1).strip().strip("'"))
    return out
