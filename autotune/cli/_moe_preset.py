"""The Mixture-of-Experts part of the ``llama_server`` preset ``autotune init`` writes.

A GGUF whose tensor table has expert tensors (``blk.N.ffn_*_exps``) gets, on a box with GPUs,
an ``n_cpu_moe`` set bracketing the predicted fit boundary: the fewest layers whose experts
must stay in system RAM for the rest to fit in VRAM (:func:`fit_boundary`, from the same
prediction that screens trials); on a CPU-only box a note that expert placement has no
effect. Either way it adds draft-free speculation (``spec_type``). A dense file gets nothing.
"""

from __future__ import annotations

from autotune.cli._model_files import ModelFile


def is_moe(m: ModelFile) -> bool:
    """Whether the GGUF has expert tensors (read from its tensor table)."""
    from autotune.engines.llamacpp.moe import layer_table

    return m.format == "gguf" and m.path.is_file() and layer_table(m.path)["moe"]


def fit_boundary(m: ModelFile, gpus: list[dict]) -> tuple[int, float, float]:
    """(smallest ``n_cpu_moe`` predicted to fit every card, VRAM it needs on the fullest
    card, that card's memory), with every layer offloaded and llama-server's other defaults;
    ``n_layers + 1`` when even every expert in RAM does not fit."""
    from autotune.engines.llama_server.engine import LlamaServerEngine
    from autotune.engines.llama_server.predict import predict_llama_server

    settings = {"gpus": [dict(g) for g in gpus]}
    variants = {"m": {"path": str(m.path)}}
    last = (0.0, 0.0)
    for n in range(m.n_layers + 1):
        p = LlamaServerEngine.full_params({"model": "m", "n_cpu_moe": n}, settings, variants)
        pred = predict_llama_server(p, settings, variants)
        pairs = list(zip(pred.need_gb[1:], pred.have_gb[1:]))
        if not pairs:
            break
        last = max(pairs, key=lambda x: x[0] / x[1])
        if all(need <= have for need, have in pairs):
            return n, last[0], last[1]
    return m.n_layers + 1, last[0], last[1]


def moe_knobs(body, m: ModelFile, gpus: list[dict]) -> int:
    """Add the MoE knobs of ``m`` to the preset's ``space`` lines; the number of knobs added."""
    if not is_moe(m):
        return 0
    added = 0
    if gpus:
        b, need, have = fit_boundary(m, gpus)
        picks = sorted({0} | {x for x in (b - 4, b - 2, b, b + 2, b + 4) if 1 <= x <= m.n_layers})
        why = (f"experts of the first N layers in RAM; predicted fit boundary {b} "
               f"({need:.1f} of {have:.1f} GB on the fullest card); 0 is the default")
        if b == 0:
            why = "the whole model is predicted to fit in VRAM; 0 (every expert on the GPU) is the default"
        elif b > m.n_layers:
            why = "even every expert in RAM is predicted not to fit: lower the context or the quant"
        body.key(2, "n_cpu_moe", {"type": "categorical", "choices": picks, "ordered": True}, why)
        added += 1
    else:
        body.add("  # a MoE model on a CPU-only box: expert placement (n_cpu_moe, cpu_moe) has no "
                 "effect; declare GPUs (--gpus) to tune it")
    body.key(2, "spec_type", {"type": "categorical", "choices": ["none", "ngram-simple", "ngram-mod"]},
             "draft-free speculation: pays on repetitive output, measured not assumed")
    return added + 1
