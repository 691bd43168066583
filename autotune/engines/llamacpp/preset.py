"""``autotune init``'s preset for the llamacpp engine: quants, threads, batch sizes, KV types,
contexts and GPU layers chosen from the box and the GGUF, each range with its reason."""

from __future__ import annotations

from autotune.engines.llamacpp.gguf_memory import gguf_shape
from autotune.engines.llamacpp.gguf_memory import kv_cache_mb
from autotune.engines.llamacpp.gguf_memory import kv_types_for
from autotune.engines.model_files import ModelFile
from autotune.engines.model_files import ModelSet
from autotune.engines.predict import GPU_OVERHEAD_GB
from autotune.engines.presets import Box
from autotune.engines.presets import Lines
from autotune.engines.presets import budget
from autotune.engines.presets import contexts
from autotune.engines.presets import header
from autotune.engines.presets import model_knob
from autotune.engines.presets import tail
from autotune.engines.presets import trial_seconds
from autotune.engines.presets import variants_block


def init_preset(ms: ModelSet, box: Box, name: str, config_dir: str) -> str:
    """The engine's ``presetter``: whether this llama-cpp-python offloads to a GPU decides the
    GPU knobs; the GGUF's shape sizes the KV cache."""
    from dataclasses import replace

    if box.gpus and box.offload is None:
        box = replace(box, offload=_offload())
    return llamacpp_preset(ms, box, gguf_shape(ms.best.path), name, config_dir)


def _offload() -> bool | None:
    try:
        import llama_cpp

        return bool(llama_cpp.llama_supports_gpu_offload())
    except Exception:  # noqa: BLE001 - not installed or broken: doctor says which
        return None


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


def llamacpp_space(out: Lines, ms: ModelSet, box: Box, shape: dict) -> tuple[int, bool, bool]:
    """The llama.cpp space; returns (searched knobs, GPU offload in the space, KV type knobs in it)."""
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
    kv_types, left_out = kv_types_for(shape)
    out.key(2, "flash_attn", {"type": "bool"},
            "needed by a quantized V cache" if len(kv_types) > 1 else "off (the default) or on")
    if len(kv_types) > 1:
        where = "CUDA flash attention runs fast (matched pairs: rule)" if gpu else "the CPU build runs"
        out.key(2, "type_k", {"type": "categorical", "choices": kv_types, "ordered": True},
                f"KV types {where}" + (f"; {left_out}" if left_out else ""))
        out.key(2, "type_v", {"type": "categorical", "choices": kv_types, "ordered": True},
                "quantized V needs flash_attn (rule)")
        n += 2
    else:
        out.add(f"  # type_k, type_v: f16 only; {left_out}")
    n += 6
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
    return n, gpu, len(kv_types) > 1


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
    n, gpu, kv_knobs = llamacpp_space(body, ms, box, shape)
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
    if kv_knobs:  # else the space has no type_k / type_v
        out.add('  - {when: "type_v != \'f16\'", require: "flash_attn", reason: "a quantized V cache needs '
                'flash_attn in llama.cpp"}')
    if gpu and kv_knobs:
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
