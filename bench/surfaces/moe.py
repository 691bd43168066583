"""A MoE surface (issue 41): a 30B-A3B model served by llama-server on one 24 GB card + DDR5.

``moe_30b(params)``: Qwen3-30B-A3B GGUF on an RTX 4090 24 GB next to dual-channel DDR5-6000,
knobs quant, ``n_cpu_moe`` (layers whose expert tensors stay in RAM), context, KV type,
ubatch, threads and flash attention (a quantized V cache needs it: the preset's rule).
Public numbers, each with where it comes from:

- Qwen3-30B-A3B's config.json (Hugging Face): 48 layers, hidden 2048, 32 query heads, 4 KV
  heads, head dim 128, 128 experts of which 8 are active, expert FFN width 768, 30.5e9
  parameters of which 3.3e9 active (the model card). Experts: 128 x 3 x 2048 x 768 x 48 =
  29.0e9, so ~5% of the weights (attention, norms, embeddings) are not experts.
- GGUF sizes: Q4_K_M 18.6 GB, Q5_K_M 21.7, Q6_K 25.1, Q8_0 32.5 GB (the file list of a
  Qwen3-30B-A3B GGUF repository, rounded) = 17.3, 20.2, 23.4, 30.3 GiB.
- RTX 4090: 24 GB, 1008 GB/s, ~165 dense fp16 TFLOPS (NVIDIA spec sheet); DDR5-6000 dual
  channel 96 GB/s; PCIe 4.0 x16 32 GB/s (published).
- The spill region: the NVIDIA Windows driver's "CUDA sysmem fallback policy" (driver
  536.40 and later) moves allocations past VRAM into system RAM instead of failing; decode
  then collapses (users report several-fold slowdowns). Its width, the slowdown, the CUDA
  context, compute buffers, efficiencies, per-token overhead and the perplexity deltas per
  quant and KV type are labelled round guesses: ``K`` holds them, and
  ``bench/surfaces/families.py`` draws them per instance.
"""

from __future__ import annotations

import math

from models import GIB
from models import KV_BYTES
from models import KV_PPL
from models import SimFailure
from models import llama_alloc

MOE_GB = {"Q4_K_M": 17.3, "Q5_K_M": 20.2, "Q6_K": 23.4, "Q8_0": 30.3}
MOE_PPL = {"Q4_K_M": 2.0, "Q5_K_M": 0.8, "Q6_K": 0.3, "Q8_0": 0.0}  # % vs bf16, round guesses
LAYERS, DENSE, ACTIVE = 48, 0.05, 8 / 128  # share of the file not experts; experts read a token
KV_ELEMS = 48 * 4 * 128 * 2  # K and V elements per token
PROMPT = 4000  # the workload's prompt: n_ctx must hold it and 512 generated tokens
CORES = 16  # a 16-core desktop CPU
K = {"ctx_gb": 0.8, "buf_gb": 0.45, "margin_gb": 0.5, "spill_gb": 1.2, "spill_x": 5.0,
     "gpu_eff": 0.8, "ram_bw": 96e9 * 0.65, "sat_threads": 8.0, "all_core": 0.08, "tok_s": 0.004,
     "sync_s": 1.0e-4, "pcie_bw": 25e9, "tflops": 165e12 * 0.5, "dequant": 0.03, "no_fa_kv": 1.25,
     "ppl_w": 1.0, "ppl_kv": 1.0}


def moe_30b(params: dict, const: dict | None = None) -> dict[str, float]:
    c = const or K
    quant, n_cpu, n_ctx = params["quant"], int(params["n_cpu_moe"]), int(params["n_ctx"])
    kv, ub, threads, fa = params["kv_type"], int(params["ubatch"]), int(params["threads"]), bool(params["flash_attn"])
    if n_ctx < PROMPT + 512:
        raise SimFailure(f"HTTP 400: request ({PROMPT + 512} tokens) exceeds the available context size "
                         f"({n_ctx} tokens), try increasing it")
    file_gb = MOE_GB[quant]
    layer_gb = file_gb * (1 - DENSE) / LAYERS  # one layer's experts
    kv_gb = KV_ELEMS * KV_BYTES[kv] * n_ctx / GIB
    scores = 0.0 if fa else ub * n_ctx * 32 * 4 / GIB  # f32 attention scores without flash attention
    buffers = [file_gb * DENSE + layer_gb * (LAYERS - n_cpu), kv_gb, c["buf_gb"] * ub / 512 + scores]
    vram = c["ctx_gb"] + sum(buffers)
    limit = 24.0 - c["margin_gb"]
    if vram > limit + c["spill_gb"]:
        llama_alloc(buffers, limit + c["spill_gb"] - c["ctx_gb"])
    spill = vram > limit  # the driver spills to system RAM: it runs, slowly
    kv_read = KV_ELEMS * KV_BYTES[kv] * (PROMPT + 256) * (1.0 if fa else c["no_fa_kv"])
    gpu_b = (file_gb * DENSE * 0.6 + layer_gb * ACTIVE * (LAYERS - n_cpu)) * GIB + kv_read
    cpu_bw = c["ram_bw"] * min(1.0, 0.3 + 0.7 * min(threads, c["sat_threads"]) / c["sat_threads"])
    cpu_bw /= 1 + (c["all_core"] if threads >= CORES else 0.0)  # the main thread fights its workers
    t = gpu_b / (1008e9 * c["gpu_eff"]) + layer_gb * ACTIVE * n_cpu * GIB / cpu_bw
    t = (t + n_cpu * c["sync_s"] + c["tok_s"]) * (1 + (c["dequant"] if kv != "f16" else 0.0))
    if spill:
        t *= c["spill_x"]
    passes = math.ceil(PROMPT / ub)  # each ubatch streams the RAM-resident experts over PCIe
    flops = 2 * 3.3e9 * PROMPT * (1.0 if fa else 1.3)
    pre = passes * layer_gb * n_cpu * GIB / c["pcie_bw"] + flops / c["tflops"] / min(1.0, 0.35 + ub / 1500)
    ttft = pre * (2.0 if spill else 1.0) * 1000 + 30.0
    ppl = MOE_PPL[quant] * c["ppl_w"] + 2 * KV_PPL[kv] * c["ppl_kv"]
    return {"decode_tps": 1.0 / t, "ttft_p50_ms": ttft, "ttft_p95_ms": ttft * 1.08,
            "ppl_delta_pct": ppl, **vram_read(vram, limit)}


# How the trial's VRAM is read (SPILL_READ): "free", as autotune.hardware.VramSampler reads it on
# a real box: the peak above the idle reading, which a spill fills up to what was free at the
# start (the card less the margin: the desktop, other processes), reported beside it as
# vram_free_gb; "card" (before session 24), the peak capped at the 24 GB card, no free reading.
SPILL_READ = "free"


def vram_read(vram: float, limit: float) -> dict[str, float]:
    if SPILL_READ == "free":
        return {"vram_peak_gb": min(vram, limit), "vram_free_gb": limit}
    return {"vram_peak_gb": min(vram, 24.0)}
