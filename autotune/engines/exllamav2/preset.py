"""``autotune init``'s preset for the exllamav2 engine: bpw variants, cache modes, gpu_split
(the splits the prediction says fit), draft and context, each range with its reason."""

from __future__ import annotations

import math

from autotune.engines.model_files import ModelSet
from autotune.engines.presets import Box
from autotune.engines.presets import Lines
from autotune.engines.presets import budget
from autotune.engines.presets import header
from autotune.engines.presets import model_knob
from autotune.engines.presets import tail
from autotune.engines.presets import trial_seconds
from autotune.engines.presets import variants_block
from autotune.errors import ConfigError


def init_preset(ms: ModelSet, box: Box, name: str, config_dir: str) -> str:
    """The engine's ``presetter``: needs the GPUs it will run on."""
    if not box.gpus:
        raise ConfigError("--gpus", None, "ExLlamaV2 runs on NVIDIA GPUs and NVML found none here; "
                          "name the GPUs of the box that will run it, e.g. --gpus 'RTX 4090:24'")
    return exllamav2_preset(ms, box, name, config_dir, _predictor(ms, box))


def _predictor(ms: ModelSet, box: Box):
    from autotune.engines.exllamav2.engine import ExLlamaV2Engine
    from autotune.engines.exllamav2.predict import predict_exllamav2

    variants = {v.name: {"path": str(v.path), "bpw": v.bpw} for v in ms.variants}
    settings = {"gpus": [dict(g) for g in box.gpus]}

    def fits(variant: str, split: str) -> bool | None:
        p = ExLlamaV2Engine.full_params({"model": variant, "gpu_split": split, "cache_mode": "Q4"},
                                        settings, variants)
        return predict_exllamav2(p, settings, variants).fits

    return fits


def gpu_splits(ms: ModelSet, box: Box, predict) -> tuple[list[str], str]:
    """gpu_split choices: auto, tp with 2+ GPUs, and manual splits the predictor says fit."""
    if len(box.gpus) < 2:
        return ["auto"], ""
    choices = ["auto", "tp"]
    mem = [float(g["memory_gb"]) for g in box.gpus]
    for v in sorted(ms.variants, key=lambda x: x.size_gb):
        for slack in (2, 4):
            first = max(1, int(mem[0] - slack))
            rest = math.ceil(v.size_gb - first) + 1
            if rest < 1 or rest > mem[1] - 1:
                continue
            split = ",".join(str(x) for x in [first, rest] + [0] * (len(mem) - 2))
            if split not in choices and predict(v.name, split) is not False:
                choices.append(split)
    return choices[:6], ("auto, tensor-parallel, and GB-of-weights-per-GPU splits predicted to fit "
                         "(the rest are refused before launch)")


def exllamav2_preset(ms: ModelSet, box: Box, name: str, config_dir: str, predict) -> str:
    """The ExLlamaV2 preset (hydra_cluster-like) for ``ms`` on ``box``'s GPUs."""
    out = Lines()
    header(out, ms, box, "exllamav2", name, config_dir)
    m = ms.best
    bw = min((g.get("bandwidth_gbps") or 300.0) for g in box.gpus)
    seconds = trial_seconds(m, bw / max(m.size_gb * 1.0737, 1e-3)) + m.size_gb * 2  # EXL2 loads slower
    body = Lines()
    body.add("space:")
    n = model_knob(body, ms)
    body.key(2, "cache_mode", {"type": "categorical", "choices": ["FP16", "Q8", "Q6", "Q4"], "ordered": True},
             "ExLlamaV2's cache modes: Q8-Q4 free VRAM for context at little quality")
    splits, why = gpu_splits(ms, box, predict)
    if len(splits) > 1:
        body.key(2, "gpu_split", {"type": "categorical", "choices": splits}, why)
        n += 1
    top = min(m.n_ctx_train or 4096, 16384)
    if top > 4096:
        body.key(2, "max_seq_len", {"type": "int", "low": 4096, "high": top // 4096 * 4096, "step": 4096},
                 f"trained to {m.n_ctx_train}; 4096 is the default, 16384 at most here")
        n += 1
    body.key(2, "chunk_size", {"type": "categorical", "choices": [1024, 2048, 4096]},
             "prompt chunk per forward pass; 2048 is the default")
    n += 2
    if ms.draft:
        body.key(2, "draft_model", {"type": "categorical", "choices": ["none", ms.draft.name]},
                 f"{ms.draft.title}: same architecture and vocabulary, {ms.draft.n_params / 1e9:.1f}B params")
        body.key(2, "num_draft_tokens", {"type": "int", "low": 1, "high": 8, "when": "draft_model != 'none'"},
                 "draft K (the default 4 included)")
        n += 2
    n_trials, why = budget(n, seconds)
    out.add("study:")
    out.key(2, "name", name)
    out.key(2, "n_trials", n_trials, why)
    out.key(2, "trial_timeout_s", int(max(600, 10 * seconds)), "loading a large model takes minutes")
    out.add()
    gpus = [{"name": g["name"], "memory_gb": round(float(g["memory_gb"]), 1)} for g in box.gpus]
    defaults = {} if top >= 4096 else {"defaults": {"max_seq_len": top}}
    settings = [("gpus", gpus, "the resource plan: GPU 0 first, as CUDA numbers them")]
    settings += [(k, v, f"trained to {top} tokens only") for k, v in defaults.items()]
    variants_block(out, ms, settings)
    out.rows += body.rows
    cons = [("ppl_delta_pct <= 2.0", "at most 2% worse perplexity than the reference"),
            (f"vram_peak_gb <= {box.vram_gb - 1:g}", "all VRAM but 1 GiB of slack")]
    tail(out, cons, {"model": m.name, "cache_mode": "FP16"}
         | ({"draft_model": "none"} if ms.draft else {}),
         {"num_gpus": (len(box.gpus), "a trial may use every GPU"),
          "max_concurrent": (1, "one model on all the GPUs at a time")})
    return out.text()
