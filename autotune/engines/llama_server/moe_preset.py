"""The Mixture-of-Experts part of the ``llama_server`` preset ``autotune init`` writes.

A GGUF whose tensor table has expert tensors (``blk.N.ffn_*_exps``) gets, on a box with GPUs,
an ``n_cpu_moe`` set bracketing the predicted fit boundary: the fewest layers whose experts
must stay in system RAM for the rest to fit in VRAM (:func:`fit_boundary`, from the same
prediction that screens trials); on two cards also a ``tensor_split`` by bytes
(:func:`byte_split`: ``--n-cpu-moe`` empties the first layers, which the default split counts
as full ones); on a CPU-only box a note that expert placement has no
effect. Either way it adds draft-free speculation (``spec_type``). A dense file gets nothing.
"""

from __future__ import annotations

from autotune.engines.model_files import ModelFile


def is_moe(m: ModelFile) -> bool:
    """Whether the GGUF has expert tensors (read from its tensor table)."""
    from autotune.engines.llamacpp.moe import layer_table

    return m.format == "gguf" and m.path.is_file() and layer_table(m.path)["moe"]


def _needs(m: ModelFile, gpus: list[dict], params: dict) -> list[tuple[float, float]]:
    """(predicted need, memory) of each card for llama-server's defaults and ``params``."""
    from autotune.engines.llama_server.engine import LlamaServerEngine
    from autotune.engines.llama_server.predict import predict_llama_server

    settings = {"gpus": [dict(g) for g in gpus]}
    variants = {"m": {"path": str(m.path)}}
    p = LlamaServerEngine.full_params({"model": "m", **params}, settings, variants)
    pred = predict_llama_server(p, settings, variants)
    return list(zip(pred.need_gb[1:], pred.have_gb[1:]))


def byte_split(m: ModelFile, gpus: list[dict], n_cpu_moe: int) -> tuple[str, float, float]:
    """The ``tensor_split`` of two cards (percent, by 5) whose fullest card is the least full at
    ``n_cpu_moe``, that card's predicted share of its memory, and the default split's."""
    def fullest(split: str) -> float:
        return max(need / have for need, have in _needs(m, gpus, {"n_cpu_moe": n_cpu_moe,
                                                                  "tensor_split": split}))

    best = min((f"{a},{100 - a}" for a in range(5, 100, 5)), key=fullest)
    return best, fullest(best), fullest("")


def split_boundary(m: ModelFile, gpus: list[dict]) -> tuple[int, str, float, float]:
    """(smallest ``n_cpu_moe`` that some split by bytes fits on two cards, that split, its
    fullest card's share of memory, the default split's), as :func:`byte_split`."""
    for n in range(m.n_layers + 1):
        split, full, default = byte_split(m, gpus, n)
        if full <= 1.0:
            return n, split, full, default
    return m.n_layers + 1, *byte_split(m, gpus, m.n_layers)


def fit_boundary(m: ModelFile, gpus: list[dict]) -> tuple[int, float, float]:
    """(smallest ``n_cpu_moe`` predicted to fit every card, VRAM it needs on the fullest
    card, that card's memory), with every layer offloaded and llama-server's other defaults;
    ``n_layers + 1`` when even every expert in RAM does not fit."""
    last = (0.0, 0.0)
    for n in range(m.n_layers + 1):
        pairs = _needs(m, gpus, {"n_cpu_moe": n})
        if not pairs:
            break
        last = max(pairs, key=lambda x: x[0] / x[1])
        if all(need <= have for need, have in pairs):
            return n, last[0], last[1]
    return m.n_layers + 1, last[0], last[1]


def _bracket(b: int, n_layers: int) -> set[int]:
    return {x for x in (b - 4, b - 2, b, b + 2, b + 4) if 1 <= x <= n_layers}


def moe_knobs(body, m: ModelFile, gpus: list[dict]) -> int:
    """Add the MoE knobs of ``m`` to the preset's ``space`` lines; the number of knobs added."""
    if not is_moe(m):
        return 0
    if not gpus:
        body.add("  # a MoE model on a CPU-only box: expert placement (n_cpu_moe, cpu_moe) has no "
                 "effect; declare GPUs (--gpus) to tune it")
    else:
        b, need, have = fit_boundary(m, gpus)
        picks = {0} | _bracket(b, m.n_layers)
        why = (f"experts of the first N layers in RAM; predicted fit boundary {b} "
               f"({need:.1f} of {have:.1f} GB on the fullest card); 0 is the default")
        if b == 0:
            why = ("the whole model is predicted to fit in VRAM; 0 (every expert on the GPU) "
                   "is the default")
        elif b > m.n_layers:
            why = ("even every expert in RAM is predicted not to fit: lower the context or "
                   "the quant")
        split = None
        if len(gpus) == 2 and 0 < b <= m.n_layers:
            b2, split, full, default = split_boundary(m, gpus)
            if b2 < b:
                picks |= _bracket(b2, m.n_layers)
                why += f"; {b2} with a tensor_split by bytes"
        body.key(2, "n_cpu_moe", {"type": "categorical", "choices": sorted(picks), "ordered": True},
                 why)
        if split:
            body.key(2, "tensor_split", {"type": "categorical", "choices": ["", split]},
                     f"layers by bytes, not count: at n_cpu_moe {b2} the fullest card is "
                     f"predicted at {full:.0%} with {split}, {default:.0%} with the default "
                     "split (\"\")")
    spec = ["none", "ngram-simple", "ngram-mod"]
    body.key(2, "spec_type", {"type": "categorical", "choices": spec},
             "draft-free speculation: pays on repetitive output, measured not assumed")
    return 1 + bool(gpus) + bool(gpus and split)
