"""Surface families (issue 41): each simulated surface as a generator of instances.

An instance is a seed. :func:`constants` draws the surface's model constants (``models.K``,
``moe.K``) from the ranges in :data:`RANGES`: bandwidth efficiencies, overheads, draft and
speculative acceptance, perplexity scales per quant and cache type, CUDA-graph and buffer
sizes (where the OOM and crash edges fall), fixed latencies (where a TTFT bound falls) and
the timing noise. The structure follows: whether a draft or a speculative method wins,
which quant meets the perplexity bound, whether the optimum sits inside, on a constraint
edge or on a crash edge (:func:`structure` names it per instance). Instance -1 is the
hand-written surface itself (``models.K``), so every earlier result stays as it was.

The ranges are what a user would call plausible for that hardware, as multiples of the
hand-written values or absolute (the hand-written value inside the range). The presets'
``predict`` blocks (prior mode physics) and ``prior/*_misleading.yaml`` are static text: they
hold what a user could know (spec sheets, model shapes), never an instance's draws.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import models  # noqa: E402
import moe  # noqa: E402

MODELS: dict[str, Callable[..., dict[str, float]]] = {**models.SURFACES, "moe_30b": moe.moe_30b}
BASE: dict[str, dict[str, float]] = {**models.K, "moe_30b": moe.K}
FAMILIES = tuple(MODELS)
NOISE_DEFAULT = 0.03
# constant -> (low, high): drawn uniformly; "x" ranges multiply the base value, "=" ones are
# absolute; a tuple of choices draws one of them
_X, _A = "x", "="
RANGES: dict[str, dict[str, tuple]] = {
    "exl2_70b": {"ctx_gb": (_A, 0.5, 1.2), "tp_gb": (_A, 0.6, 1.8), "bw_eff": (_A, 0.6, 0.88),
                 "tp_sync_s": (_A, 15e-6, 90e-6), "alpha": (_A, 0.4, 0.85), "t_draft_s": (_A, 1.2e-3, 3.5e-3),
                 "verify_k": (_A, 0.02, 0.09), "flops_eff": (_A, 0.6, 1.3), "ttft_ms": (_A, 10.0, 60.0),
                 "draft_ttft": (_A, 0.5, 2.0), "ppl_w": (_A, 0.5, 1.6), "ppl_kv": (_A, 0.4, 2.5),
                 "noise": (_A, 0.02, 0.05)},
    "streamer_70b": {"alpha_1b": (_A, 0.6, 1.5), "alpha_8b": (_A, 0.7, 1.4), "t_draft": (_A, 0.6, 1.6),
                     "ram_layers": (40, 46, 50, 54, 58, 62), "ppl_skip": (_A, 4.0, 10.0),
                     "stream_A": (_A, 0.6, 1.5), "stream_B": (_A, 0.6, 1.5), "stream_C": (_A, 0.6, 1.6),
                     "alpha_skip": (_A, 0.2, 1.2), "noise": (_A, 0.02, 0.05)},
    "llamacpp_7b": {"ctx_gb": (_A, 0.3, 1.2), "no_fa_kv": (_A, 1.05, 1.6), "ram_bw": (_A, 35e9, 90e9),
                    "bw_eff": (_A, 0.6, 0.9), "dequant": (_A, 0.0, 0.08), "flops": (_A, 70e12, 165e12),
                    "pcie_bw": (_A, 12e9, 28e9), "ppl_w": (_A, 0.4, 1.5), "ppl_kv": (_A, 0.3, 2.5),
                    "noise": (_A, 0.02, 0.05)},
    "cpu_7b": {"ram_bw": (_A, 25e9, 60e9), "sat_threads": (_A, 3.0, 8.0), "smt": (_A, 0.0, 0.35),
               "core_flops": (_A, 12e9, 40e9), "smt_cost": (_A, 0.0, 0.1), "ppl_w": (_A, 0.5, 1.5),
               **{f"k_{q}": (_A, 0.8, 1.25) for q in models.CPU_QUANT_GB}, "noise": (_A, 0.02, 0.05)},
    "vllm_h100": {"alpha_ngram": (_A, 0.5, 1.6), "alpha_eagle": (_A, 0.7, 1.2), "cost_ngram": (_A, 0.3, 2.0),
                  "cost_eagle": (_A, 0.5, 1.6), "graph_seq": (_A, 0.007, 0.016), "act_tok": (_A, 0.0002, 0.0004),
                  "bw_eff": (_A, 0.65, 0.9), "chunk_stall": (_A, 0.05, 0.35), "ppl_w": (_A, 0.6, 1.4),
                  "ppl_kv": (_A, 0.5, 2.0), "noise": (_A, 0.02, 0.05)},
    "moe_30b": {"ctx_gb": (_A, 0.5, 1.2), "buf_gb": (_A, 0.25, 0.7), "margin_gb": (_A, 0.2, 1.2),
                "spill_gb": (_A, 0.5, 2.5), "spill_x": (_A, 2.5, 10.0), "gpu_eff": (_A, 0.6, 0.9),
                "ram_bw": (_A, 40e9, 80e9), "sat_threads": (_A, 4.0, 12.0), "all_core": (_A, 0.0, 0.25),
                "tok_s": (_A, 0.002, 0.007), "sync_s": (_A, 2e-5, 3e-4), "pcie_bw": (_A, 15e9, 28e9),
                "tflops": (_A, 50e12, 110e12), "dequant": (_A, 0.0, 0.08), "no_fa_kv": (_A, 1.05, 1.6),
                "ppl_w": (_A, 0.3, 1.8), "ppl_kv": (_A, 0.3, 2.5), "noise": (_A, 0.02, 0.05)},
}
RANGES["llamacpp_noisy"] = {**RANGES["llamacpp_7b"], "crash_batch": (512, 1024, 2048),
                            "noise": (_A, 0.07, 0.13)}


def constants(family: str, instance: int) -> dict[str, float]:
    """The model constants of ``family``'s instance (``instance < 0``: the hand-written ones),
    with its timing noise under ``noise``."""
    base = {**BASE[family], "noise": models.NOISE.get(family, NOISE_DEFAULT)}
    if instance < 0:
        return base
    rng = random.Random(f"{family}|{instance}")
    out = dict(base)
    for name, spec in RANGES[family].items():
        if spec[0] == _X:
            out[name] = base[name] * rng.uniform(spec[1], spec[2])
        elif spec[0] == _A:
            out[name] = rng.uniform(spec[1], spec[2])
        else:
            out[name] = rng.choice(spec)
    return out


def model(family: str, instance: int = -1) -> Callable[[dict], dict[str, float]]:
    """``params -> metrics`` of the instance (raises ``models.SimFailure`` on OOM or a crash)."""
    const = constants(family, instance)
    fn = MODELS[family]
    return lambda params: fn(params, const)


def noise(family: str, instance: int = -1) -> float:
    return constants(family, instance)["noise"]


def structure(truth) -> dict[str, str]:
    """Where ``truth``'s optimum sits: ``edge`` (interior; constraint edge: a one-step neighbour
    breaks a constraint; crash edge: one OOMs or crashes) and its categorical and bool levels,
    a conditional knob's value ("-": its branch is off) and a draft's branch (``draft_k`` 0)."""
    space = truth.preset["space"]
    best = max(truth.table, key=truth.table.get)
    params = {k: _typed(space[k], v) for k, v in best}
    edge = "interior"
    for name, d in space.items():
        values = _values(d)
        if name not in params or values is None or params[name] not in values:
            continue
        i = values.index(params[name])
        for j in (i - 1, i + 1):
            if 0 <= j < len(values):
                value, metrics, why = truth.evaluate({**params, name: values[j]})
                if why.startswith("rule"):
                    continue
                if not value and metrics is None:
                    edge = "crash edge"
                elif not value and edge == "interior":
                    edge = "constraint edge"
    levels = {n: str(params.get(n, "-")) for n, d in space.items() if d["type"] in ("categorical", "bool")
              or "when" in d}
    if "draft_k" in space:  # the draft's branch: 0 turns it off
        levels["draft"] = "on" if int(params.get("draft_k", 0)) else "off"
    return {"edge": edge, **levels}


def _values(d: dict) -> list | None:
    if d["type"] == "categorical":
        return list(d["choices"])
    if d["type"] == "bool":
        return [False, True]
    if d["type"] == "int":
        return list(range(int(d["low"]), int(d["high"]) + 1, int(d.get("step", 1))))
    return None


def _typed(d: dict, text: str):
    """A truth key's string value back as the space's value."""
    for v in _values(d) or ():
        if str(v) == text:
            return v
    return float(text) if d["type"] == "float" else text
