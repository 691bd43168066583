"""``autotune init``'s preset for the llama_server engine: a serving study (the most goodput at
a TTFT bound) with slots, batch sizes, KV types and GPU layers, each range with its reason."""

from __future__ import annotations

import math

from autotune.engines.llama_server.moe_preset import moe_knobs
from autotune.engines.llamacpp.gguf_memory import gguf_shape
from autotune.engines.llamacpp.gguf_memory import kv_types_for
from autotune.engines.model_files import ModelSet
from autotune.engines.predict import GPU_OVERHEAD_GB
from autotune.engines.presets import WORKLOAD
from autotune.engines.presets import Box
from autotune.engines.presets import Lines
from autotune.engines.presets import budget
from autotune.engines.presets import header
from autotune.engines.presets import model_knob
from autotune.engines.presets import variants_block


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
    kv, left_out = kv_types_for(gguf_shape(m.path)) if m.path.is_file() else (["f16", "q8_0", "q4_0"], "")
    if len(kv) > 1:
        body.key(2, "cache_type_k", {"type": "categorical", "choices": kv, "ordered": True},
                 "KV cache types: memory for slots" + (f"; {left_out}" if left_out else ""))
        body.key(2, "cache_type_v", {"type": "categorical", "choices": kv, "ordered": True},
                 "quantized V needs flash_attn")
        n += 2
    else:
        body.add(f"  # cache_type_k, cache_type_v: f16 only; {left_out}")
    n += 5 + moe_knobs(body, m, list(box.gpus))  # none for a dense model
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
