"""Where llama.cpp puts a model's tensors, read from the GGUF tensor table: dense and expert
bytes per layer, placed by ``n_gpu_layers``, ``--n-cpu-moe``, ``--cpu-moe``, a named
``--override-tensor`` placement, ``--tensor-split``, ``--split-mode`` and ``--main-gpu``.

The rules are llama.cpp's (src/llama-model.cpp, common/common.h of the vendored copy):

- the input embeddings (``token_embd``) stay in system RAM; a token reads one row of them;
- the last ``n_gpu_layers`` of the ``n_layers + 1`` "layers" (the output head counts as the
  last) go to the GPUs; ``split_mode: none`` puts them all on ``main_gpu``, otherwise GPU
  ``j`` takes the layers whose index falls in its share of the cumulative ``tensor_split``
  (default: the cards' memory), counted in layers, not bytes;
- an expert tensor (``blk.N.ffn_{up,down,gate,gate_up}_exps``, llama.cpp's
  ``LLM_FFN_EXPS_REGEX``) of a layer whose experts are overridden to the CPU stays in RAM
  whatever its layer's device; everything else of a layer (attention, norms, the router,
  shared experts) is the layer's "dense" part;
- a token reads every dense byte of every layer, the output head, and the active experts'
  share (``expert_used_count / expert_count``) of each layer's expert bytes, on the device
  that holds them.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from autotune.engines.llamacpp.gguf_memory import _gguf_metadata
from autotune.engines.llamacpp.gguf_memory import _version
from autotune.engines.llamacpp.gguf_memory import read_gguf_tensors

EXPS = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")
UP_DOWN = re.compile(r"\.ffn_(up|down)_(ch|)exps")
LAYER = re.compile(r"^blk\.(\d+)\.")


def layer_table(model_path: str | Path) -> dict:
    """Bytes of the model by part, from its GGUF tensor table (cached per file version).

    Returns ``n_layers``, per-layer lists ``dense``, ``experts`` and ``up_down`` (the up and
    down experts alone), ``embd`` (token_embd), ``output`` (the head and its norm), ``tied``
    (no head of its own: the embeddings are read as the head, and copied to a GPU that runs
    it), ``n_expert``, ``n_expert_used`` and
    ``moe`` (whether any layer has experts).
    """
    return _layer_table(*_version(model_path))


@functools.lru_cache(maxsize=16)
def _layer_table(path: str, size: int, mtime_ns: int) -> dict:
    meta = _gguf_metadata(path, size, mtime_ns)
    arch = meta.get("general.architecture", "")
    n_layers = int(meta.get(f"{arch}.block_count", 0))
    dense, experts, up_down = [0] * n_layers, [0] * n_layers, [0] * n_layers
    embd = output = 0
    tensors = read_gguf_tensors(path)
    for name, size in tensors.items():
        m = LAYER.match(name)
        if m and int(m.group(1)) < n_layers:
            i = int(m.group(1))
            if EXPS.search(name):
                experts[i] += size
                up_down[i] += size if UP_DOWN.search(name) else 0
            else:
                dense[i] += size
        elif name.startswith("token_embd."):
            embd += size
        else:
            output += size
    n_expert = int(meta.get(f"{arch}.expert_count", 0) or 0)
    return {"n_layers": n_layers, "dense": dense, "experts": experts, "up_down": up_down,
            "embd": embd, "output": output, "n_expert": n_expert,
            "n_expert_used": int(meta.get(f"{arch}.expert_used_count", 0) or 0),
            "moe": sum(experts) > 0, "tied": "output.weight" not in tensors}


def parse_split(value) -> list[float]:
    """``tensor_split`` as numbers: the server's ``"3,1"`` or the binding's ``[3, 1]``."""
    if not value:
        return []
    items = re.split(r"[,/]+", value) if isinstance(value, str) else list(value)
    return [float(x) for x in items if str(x).strip()]


def gpu_of_layers(n_layers: int, ngl: int, n_gpus: int, split: list[float],
                  split_mode: str = "layer", main_gpu: int = 0) -> list[int]:
    """Device of each of the ``n_layers + 1`` layers (the last is the output head): 0 is
    system RAM, ``j + 1`` is GPU ``j`` (see the module docstring)."""
    n = n_layers + 1
    if not n_gpus:
        return [0] * n
    ngl = n if ngl < 0 else max(min(ngl, n), 0)
    start = n - ngl
    if split_mode == "none":
        return [0 if i < start else main_gpu + 1 for i in range(n)]
    shares = (split + [0.0] * n_gpus)[:n_gpus] if split else [1.0] * n_gpus
    total = sum(shares) or 1.0
    cum, acc = [], 0.0
    for s in shares:
        acc += s / total
        cum.append(acc)
    out = []
    for i in range(n):
        if i < start:
            out.append(0)
            continue
        frac = (i - start) / ngl
        out.append(next((j for j, c in enumerate(cum) if frac < c), n_gpus - 1) + 1)
    return out


def placement_cpu_layers(name: str, n_layers: int) -> tuple[set[int], bool]:
    """The layers whose experts a named placement puts on the CPU, and whether only the up
    and down experts of those layers move (``exps_up_down``)."""
    if name == "exps_odd":
        return {i for i in range(n_layers) if i % 2}, False
    if name == "exps_up_down":
        return set(range(n_layers)), True
    if name.startswith("exps_last_"):
        n = int(name.removeprefix("exps_last_"))
        return set(range(max(n_layers - n, 0), n_layers)), False
    return set(), False


def cpu_expert_bytes(table: dict, i: int, p: dict) -> int:
    """Bytes of layer ``i``'s experts kept in RAM by ``cpu_moe``, ``n_cpu_moe`` and the
    ``override_tensor`` placement."""
    if p.get("cpu_moe") or i < int(p.get("n_cpu_moe") or 0):
        return table["experts"][i]
    layers, up_down_only = placement_cpu_layers(str(p.get("override_tensor") or "none"),
                                                table["n_layers"])
    if i in layers:
        return table["up_down"][i] if up_down_only else table["experts"][i]
    return 0


def place(table: dict, p: dict, n_gpus: int, default_split: list[float] | None = None) -> dict:
    """Bytes held and bytes read per token on each device (0: RAM, j + 1: GPU j).

    ``p`` holds ``n_gpu_layers`` (a number; -1 all), ``n_cpu_moe``, ``cpu_moe``,
    ``override_tensor``, ``tensor_split``, ``split_mode`` and ``main_gpu``. Returns
    ``held`` and ``read`` (bytes per device) and ``layer_device`` (per layer, the head last).
    """
    n = table["n_layers"]
    split = parse_split(p.get("tensor_split")) or list(default_split or [])
    devices = gpu_of_layers(n, int(p.get("n_gpu_layers") or 0), n_gpus, split,
                            str(p.get("split_mode") or "layer"), int(p.get("main_gpu") or 0))
    held, read = [0.0] * (n_gpus + 1), [0.0] * (n_gpus + 1)
    active = table["n_expert_used"] / table["n_expert"] if table["n_expert"] else 1.0
    for i in range(n):
        dev = devices[i]
        on_cpu = cpu_expert_bytes(table, i, p) if dev else 0
        on_dev = table["experts"][i] - on_cpu
        held[dev] += table["dense"][i] + on_dev
        read[dev] += table["dense"][i] + on_dev * active
        held[0] += on_cpu
        read[0] += on_cpu * active
    head = table["output"] + (table["embd"] if table["tied"] and devices[n] else 0)
    held[devices[n]] += head
    read[devices[n]] += table["output"] + (table["embd"] if table["tied"] else 0)
    held[0] += table["embd"]
    return {"held": held, "read": read, "layer_device": devices}
