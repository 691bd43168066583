"""Noise-free performance models of four tuning problems from the seed documents.

Each surface is a pure function ``params -> metrics`` (or :class:`SimFailure` for an OOM or
a crash), modelled on a user's notes in ``../shared/seeds/``. ``bench/surfaces/sim.py``
runs one as an engine command (adding log-normal timing noise) and ``bench/efficiency.py``
enumerates the same function to know the true feasible optimum. Pure Python, so a trial's
command starts in milliseconds.

- ``exl2_70b`` (seed 003): Llama-3.1-70B EXL2 on an RTX 5090 32 GB + RTX 4090 24 GB.
- ``streamer_70b`` (seed 001): a 70B Q6_K streamed from RAM on an RTX 3090 24 GB; a draft
  model steals VRAM from resident layers and layer skipping lowers the draft's acceptance.
- ``llamacpp_7b`` (seed 002): Qwen2.5-7B GGUF on an RTX 4090 with partial offload.
- ``cpu_7b`` (seed 004): a 7B GGUF on an 8-core / 16-thread CPU.
- ``vllm_h100`` (issue 23): Llama-3.1-8B served by a vLLM-like engine on one H100 80 GB, 9
  knobs: a conditional one (the speculative method -> its K) and a continuous one
  (gpu_memory_utilization); the optimum sits on a narrow ridge at the memory edge (CUDA
  graphs live outside the utilization budget).
- ``llamacpp_noisy`` (issue 23): the llamacpp_7b engine on a noisier box (10% timing noise)
  with a crash region no prediction covers (a kernel fault with mixed K/V cache types at
  large batches under flash attention).

``NOISE`` gives a surface's own timing noise (sim.py's default is 3%).
"""

from __future__ import annotations

import math

GIB = float(1 << 30)


class SimFailure(Exception):
    """The simulated engine fails (out of memory, context overflow): exit 1 with the text."""


def llama_alloc(buffers: list[float], free_gb: float) -> None:
    """Fail as llama.cpp does when ``buffers`` (its allocations in its order: model weights, KV
    cache, compute buffers, GiB) exceed ``free_gb``: the first that no longer fits fails with
    ggml-cuda's own line, which names that one buffer's size in MiB (not the total needed)."""
    used, gb = 0.0, 0.0
    for gb in buffers:
        used += gb
        if used > free_gb:
            break
    raise SimFailure(f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {gb * 1024:.2f} MiB "
                     "on device 0: cudaMalloc failed: out of memory")


# ---- (a) 70B EXL2 on RTX 5090 + RTX 4090 (seed 003) --------------------------------------------
EXL2_GPUS = ((32.0, 1792.0, 105.0), (24.0, 1008.0, 82.0))  # GiB, GB/s, dense TFLOPS (effective)
EXL2_CACHE = {"FP16": 2.0, "Q8": 1.03, "Q6": 0.78, "Q4": 0.53}  # bytes per element
EXL2_CACHE_PPL = {"FP16": 0.0, "Q8": 0.03, "Q6": 0.15, "Q4": 0.7}  # ppl delta %, added
EXL2_BPW_PPL = {3.0: 4.1, 3.5: 1.6, 4.0: 0.75, 4.5: 0.0}  # vs 4.5 bpw
EXL2_PROMPT = 100  # tokens of the surface's prompt


def _exl2_layout(params: dict, c: dict) -> tuple[list[float], list[float], str]:
    """(GiB needed per GPU, share of the model's layers per GPU, mode)."""
    bpw, k, seq = float(params["bpw"]), int(params["draft_k"]), int(params["max_seq_len"])
    weights = 70.6e9 * bpw / 8 / GIB
    cache = 2 * 80 * 8 * 128 * seq * EXL2_CACHE[params["cache_mode"]] / GIB
    draft = (1.24e9 * 4.0 / 8 + 2 * 16 * 8 * 64 * seq * 2.0) / GIB + 0.25 if k else 0.0
    split = str(params["gpu_split"])
    mem = [g[0] for g in EXL2_GPUS]
    base = [c["ctx_gb"] + 0.1, c["ctx_gb"]]  # CUDA context + activations; the autosplit reserve on GPU 0
    if split == "tp":
        base = [b + c["tp_gb"] for b in base]  # TP buffers on each device
    base[0] += draft
    model = weights + cache
    if split == "tp":
        share = [m / sum(mem) for m in mem]
    elif split == "auto":
        left, share = model, []
        for m, b in zip(mem, base):
            take = max(0.0, min(left, m - b - 0.25))
            share.append(take / model)
            left -= take
        share[-1] += left / model
    else:
        gb = [float(x) for x in split.split(",")]
        if weights > sum(gb):
            raise SimFailure(f"ValueError: {weights:.1f} GB of weights exceed gpu_split {split}")
        left, share = 1.0, []
        for g in gb:
            take = min(left, g / weights)
            share.append(take)
            left -= take
    need = [b + model * s for b, s in zip(base, share)]
    return need, share, split


def exl2_70b(params: dict, const: dict | None = None) -> dict[str, float]:
    c = const or K["exl2_70b"]
    need, share, split = _exl2_layout(params, c)
    for i, (n, g) in enumerate(zip(need, EXL2_GPUS)):
        if n > g[0]:
            raise SimFailure(f"torch.OutOfMemoryError: CUDA out of memory on GPU {i}: "
                             f"needs {n:.1f} GiB of {g[0]:.0f}")
    bpw, k, seq = float(params["bpw"]), int(params["draft_k"]), int(params["max_seq_len"])
    wbytes = 70.6e9 * bpw / 8
    slow = {"FP16": 1.0, "Q8": 1.015, "Q6": 1.025, "Q4": 1.035}[params["cache_mode"]]
    slow *= 1.0 + 0.012 * seq / 16384  # page table walks over a larger cache
    per = [wbytes * s / (g[1] * 1e9 * c["bw_eff"]) for s, g in zip(share, EXL2_GPUS)]
    t_target = (max(per) + 80 * 2 * c["tp_sync_s"] if split == "tp" else sum(per) + 2.0e-3) * slow
    if k:
        alpha = c["alpha"]
        expected = (1 - alpha ** (k + 1)) / (1 - alpha)
        decode = expected / (k * c["t_draft_s"] + t_target * (1 + c["verify_k"] * k))
    else:
        decode = 1.0 / t_target
    flops = 2 * 70.6e9 * EXL2_PROMPT
    pre = [flops * s / (g[2] * 1e12 * c["flops_eff"]) for s, g in zip(share, EXL2_GPUS)]
    ttft = (max(pre) + 0.006 if split == "tp" else sum(pre)) * (1 + 0.22 * (bpw - 3.0)) * slow
    ttft = ttft * 1000 + c["ttft_ms"] + ((22.0 + 7.0 * k) * c["draft_ttft"] if k else 0.0)
    ppl = EXL2_BPW_PPL[bpw] * c["ppl_w"] + EXL2_CACHE_PPL[params["cache_mode"]] * c["ppl_kv"]
    return {"decode_tps": decode, "ttft_p50_ms": ttft, "ttft_p95_ms": ttft * 1.12,
            "ppl_delta_pct": ppl, "vram_peak_gb": sum(need)}


# ---- (b) seed 001's 70B streamer on an RTX 3090 24 GB -----------------------------------------
LAYER_GB = 0.669  # Q6_K layer
STREAM_S = {"A": 0.0007, "B": 0.103, "C": 0.250}  # per layer and token: VRAM, RAM over PCIe, NVMe
RAM_LAYERS = 54  # layers the 48 GB of RAM holds next to the OS
DRAFTS = {"1b": (1.3, 0.005, 0.33), "8b": (8.0, 0.020, 0.52)}  # VRAM GiB, s/token, acceptance


def layer_cos(i: int) -> float:
    """cos(input, output) of middle layer i: 0.9915 down to 0.970 in a scattered order
    (seed 001's calibration: 10-13 layers above 0.985, 16-20 above 0.98)."""
    rank = ((i - 20) * 17) % 40
    return 0.9915 - 0.00055 * rank


def streamer_70b(params: dict, const: dict | None = None) -> dict[str, float]:
    c = const or K["streamer_70b"]
    k, ctx = int(params["draft_k"]), int(params["ctx"])
    threshold = float(params["skip_threshold"])
    kv = 80 * 8 * 128 * 2 * ctx * (4 if params["kv_type"] == "f32" else 2) / GIB
    draft_vram, t_draft, alpha0 = DRAFTS[params["draft_model"]] if k else (0.0, 0.0, 0.0)
    alpha0 *= c["alpha_1b"] if params.get("draft_model") == "1b" else c["alpha_8b"]
    t_draft *= c["t_draft"]
    if k:
        draft_vram += 32 * 8 * 128 * 2 * ctx * 2 / GIB
    free = 24.0 - 0.5 - 2 * LAYER_GB - 1.2 - kv - draft_vram  # context, staging, misc
    tier_a = max(0, min(80, int(free / LAYER_GB)))
    tier_b = min(80 - tier_a, int(c["ram_layers"]))
    tiers = ["A"] * tier_a + ["B"] * tier_b + ["C"] * (80 - tier_a - tier_b)
    skipped = [i for i in range(20, 60) if layer_cos(i) > threshold]
    ppl = c["ppl_skip"] * sum(1 - layer_cos(i) for i in skipped)
    stream = {t: s * c[f"stream_{t}"] for t, s in STREAM_S.items()}
    t_pass = sum(stream[t] for i, t in enumerate(tiers) if i not in skipped) + 0.012
    if k:
        alpha = alpha0 * math.exp(-c["alpha_skip"] * ppl)
        expected = (1 - alpha ** (k + 1)) / (1 - alpha)
        decode = expected / (k * t_draft + t_pass * (1 + 0.02 * k) + 0.06)
    else:
        decode = 1.0 / t_pass
    ttft = (t_pass * 1.1 + (0.08 if k else 0.0)) * 1000
    return {"decode_tps": decode, "ttft_p50_ms": ttft, "ttft_p95_ms": ttft * 1.05,
            "ppl_delta_pct": ppl, "vram_peak_gb": 24.0 - free + tier_a * LAYER_GB}


# ---- (c) llama.cpp Qwen2.5-7B on an RTX 4090 (seed 002) ---------------------------------------
QUANT_GB = {"Q4_K_M": 4.36, "Q5_K_M": 5.07, "Q6_K": 5.82, "Q8_0": 7.54}
QUANT_PPL = {"Q4_K_M": 2.3, "Q5_K_M": 0.85, "Q6_K": 0.3, "Q8_0": 0.0}
KV_BYTES = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
KV_PPL = {"f16": 0.0, "q8_0": 0.04, "q4_0": 0.55}
QWEN_LAYERS, PROMPT_7B = 28, 6000  # a long-document workload: n_ctx must hold 6000 + 256


def llamacpp_7b(params: dict, const: dict | None = None) -> dict[str, float]:
    c = const or K["llamacpp_7b"]
    quant, ngl, n_ctx = params["quant"], int(params["n_gpu_layers"]), int(params["n_ctx"])
    n_batch, fa = int(params["n_batch"]), bool(params["flash_attn"])
    if n_ctx < PROMPT_7B + 256:
        raise SimFailure(f"ValueError: Requested tokens ({PROMPT_7B + 256}) exceed context window of {n_ctx}")
    weights = QUANT_GB[quant]
    on_gpu = min(ngl, QWEN_LAYERS + 1) / (QWEN_LAYERS + 1)
    per_tok = QWEN_LAYERS * 4 * 128 * (KV_BYTES[params["type_k"]] + KV_BYTES[params["type_v"]])
    kv = per_tok * n_ctx / GIB
    scores = 0.0 if fa else n_batch * n_ctx * 28 * 4 / GIB  # attention scores without flash attn
    buffers = [weights * on_gpu, kv * on_gpu, scores + 0.3 if ngl else 0.0]
    vram = c["ctx_gb"] + sum(buffers)
    if vram > 24.0:
        llama_alloc(buffers, 24.0 - c["ctx_gb"])
    kv_read = per_tok * (PROMPT_7B + 128)
    cpu_b, gpu_b = weights * (1 - on_gpu) * GIB, weights * on_gpu * GIB
    kv_speed = 1.0 if fa else c["no_fa_kv"]  # without flash attention the KV is read as f32 scores too
    t = cpu_b / c["ram_bw"] + (gpu_b + kv_read * kv_speed) / (1008e9 * c["bw_eff"]) + 0.0012
    t += 0.0004 if 0 < ngl <= QWEN_LAYERS else 0.0
    dequant = (params["type_k"] != "f16") + (params["type_v"] != "f16")
    decode = 1.0 / (t * (1 + c["dequant"] * dequant))
    passes = math.ceil(PROMPT_7B / n_batch)
    flops = 2 * 7.6e9 * PROMPT_7B
    attn = (1.0 if fa else 1.6) * 4 * QWEN_LAYERS * 3584 * PROMPT_7B**2 / 2
    gpu_s = (flops * on_gpu + attn) / c["flops"] / min(1.0, 0.35 + n_batch / 1500)
    cpu_s = 0.0 if on_gpu == 1 else passes * cpu_b / c["pcie_bw"] + flops * (1 - on_gpu) / 160e12
    ttft = (gpu_s + cpu_s) * 1000 + 25.0
    ppl = (QUANT_PPL[quant] * c["ppl_w"] + KV_PPL[params["type_k"]] * c["ppl_kv"]
           + KV_PPL[params["type_v"]] * c["ppl_kv"])
    return {"decode_tps": decode, "ttft_p50_ms": ttft, "ttft_p95_ms": ttft * 1.08,
            "ppl_delta_pct": ppl, "vram_peak_gb": vram}


# ---- (d) a 7B on an 8-core / 16-thread CPU (seed 004) -----------------------------------------
CPU_QUANT_GB = {"Q4_0": 3.83, "Q4_K_M": 4.36, "Q5_K_M": 5.07, "Q8_0": 7.54}
CPU_QUANT_PPL = {"Q4_0": 4.2, "Q4_K_M": 2.3, "Q5_K_M": 0.85, "Q8_0": 0.0}
CPU_QUANT_FLOPS = {"Q4_0": 1.15, "Q4_K_M": 0.9, "Q5_K_M": 0.8, "Q8_0": 1.0}  # kernel speed
CORES, PROMPT_CPU = 8, 128


def _threads_eff(n: int, smt: float = 0.15) -> float:
    """Useful cores of n threads: linear to 8, SMT siblings add 15%, then contention."""
    if n <= CORES:
        return float(n)
    return CORES + smt * (n - CORES) - (0.9 if n == 2 * CORES else 0.0)


def cpu_7b(params: dict, const: dict | None = None) -> dict[str, float]:
    c = const or K["cpu_7b"]
    quant, n_t, n_tb = params["quant"], int(params["n_threads"]), int(params["n_threads_batch"])
    n_batch, n_ctx = int(params["n_batch"]), int(params["n_ctx"])
    if n_ctx < PROMPT_CPU + 128:
        raise SimFailure(f"ValueError: Requested tokens ({PROMPT_CPU + 128}) exceed context window of {n_ctx}")
    weights = CPU_QUANT_GB[quant] * GIB
    bw = c["ram_bw"] * min(1.0, 0.3 + 0.7 * min(n_t, CORES) / c["sat_threads"])  # a few threads saturate DDR4
    compute = 2 * 7.6e9 / (_threads_eff(n_t, c["smt"]) * c["core_flops"] * CPU_QUANT_FLOPS[quant] * c[f"k_{quant}"])
    t = max(weights / bw, compute) + 0.2 * min(weights / bw, compute) + 0.002
    if n_t > CORES:
        t *= 1 + c["smt_cost"] * (n_t - CORES)  # SMT threads fight over the caches while decoding
    t *= 1 + 0.03 * n_ctx / 4096
    passes = math.ceil(PROMPT_CPU / n_batch)
    pre = 2 * 7.6e9 * PROMPT_CPU / (_threads_eff(n_tb, c["smt"]) * 4 * c["core_flops"] * CPU_QUANT_FLOPS[quant])
    pre *= 1 + 0.9 * max(0.0, (64 - min(n_batch, 64)) / 64)  # small batches waste the matmul tiles
    ttft = (pre + passes * weights / bw) * 1000 + 15.0
    return {"decode_tps": 1.0 / t, "ttft_p50_ms": ttft, "ttft_p95_ms": ttft * 1.06,
            "ppl_delta_pct": CPU_QUANT_PPL[quant] * c["ppl_w"], "peak_rss_mb": (weights / GIB + 0.6) * 1024}


# ---- (e) a vLLM-like server, Llama-3.1-8B on one H100 80 GB (issue 23) ---------------------------
H100_GB, H100_BW, H100_TFLOPS = 80.0, 3350e9, {"none": 990e12, "fp8": 1979e12}
VLLM_CLIENTS, VLLM_PROMPT, VLLM_SHARED, VLLM_OUT = 512, 6000, 1500, 512
VLLM_SPEC = {"ngram": (0.35, 0.03, 0.0), "eagle": (0.7, 0.09, 0.6)}  # acceptance, cost/K, GB


def vllm_h100(params: dict, const: dict | None = None) -> dict[str, float]:
    c = const or K["vllm_h100"]
    quant, kv_dtype = params["quantization"], params["kv_cache_dtype"]
    util, seqs = float(params["gpu_memory_utilization"]), int(params["max_num_seqs"])
    mbt, chunked = int(params["max_num_batched_tokens"]), bool(params["enable_chunked_prefill"])
    prefix, spec = bool(params["enable_prefix_caching"]), str(params.get("speculative") or "none")
    k = int(params.get("num_speculative_tokens") or 0) if spec != "none" else 0
    weights = 16.1 if quant == "none" else 8.6
    alpha, cost_k, draft_gb = VLLM_SPEC.get(spec, (0.0, 0.0, 0.0))
    if spec in VLLM_SPEC:
        alpha, cost_k = alpha * c[f"alpha_{spec}"], cost_k * c[f"cost_{spec}"]
    graphs = 0.9 + c["graph_seq"] * seqs * (1 + 0.5 * (k > 0))  # CUDA graphs, outside the budget
    if (1 - util) * H100_GB < graphs + 1.1:
        raise SimFailure(f"torch.OutOfMemoryError: CUDA out of memory while capturing CUDA graphs "
                         f"({graphs:.1f} GiB needed outside gpu_memory_utilization={util:.2f})")
    act = 1.2 + mbt * c["act_tok"]
    pool = util * H100_GB - weights - act - draft_gb
    if pool < 1.0:
        raise SimFailure("ValueError: No available memory for the cache blocks. Try increasing "
                         "`gpu_memory_utilization` when initializing the engine.")
    kv_tok = 32 * 8 * 128 * 2 * (2 if kv_dtype == "auto" else 1) / GIB
    ctx = VLLM_PROMPT + VLLM_OUT
    per_seq = (ctx - VLLM_SHARED if prefix else ctx) * kv_tok * 1.04
    fit = (pool - (VLLM_SHARED * kv_tok if prefix else 0.0)) / per_seq
    conc = max(1.0, min(seqs, VLLM_CLIENTS, fit))
    wbytes = weights * GIB * (1 + 0.5 * draft_gb / weights if k else 1)
    kv_read = conc * (ctx / 2) * kv_tok * GIB * (1.0 if kv_dtype == "auto" else 1.08)
    flops = 2 * 8.0e9 * conc * (k + 1)
    t_step = max((wbytes + kv_read) / (H100_BW * c["bw_eff"]), flops / (H100_TFLOPS[quant] * 0.45))
    t_step = t_step * (1 + cost_k * k) + 0.0035
    tokens = (1 - alpha ** (k + 1)) / (1 - alpha) if k else 1.0
    prompt = VLLM_PROMPT - (VLLM_SHARED if prefix else 0)
    pre_s = 2 * 8.0e9 * prompt / (H100_TFLOPS[quant] * 0.55)
    stall = conc * prompt / VLLM_OUT / mbt  # prefill passes per decode step, shared by all
    if chunked:
        decode = conc * tokens / (t_step * (1 + c["chunk_stall"] * stall))
        ttft = (pre_s * (1 + 0.35 * conc * prompt / mbt / 8) + t_step) * 1000 + 25
    else:
        decode = conc * tokens / (t_step * (1 + 0.6 * stall))
        ttft = (pre_s * (1 + conc * prompt / mbt / 8) + 4 * t_step) * 1000 + 25
    ppl = (0.45 * c["ppl_w"] if quant == "fp8" else 0.0) + (0.3 * c["ppl_kv"] if kv_dtype == "fp8" else 0.0)
    return {"decode_tps": decode, "ttft_p50_ms": ttft, "ttft_p95_ms": ttft * 1.3,
            "ppl_delta_pct": ppl, "vram_peak_gb": util * H100_GB + graphs}


# ---- (f) llama.cpp on a noisy box with an unpredictable crash region (issue 23) -----------------
def llamacpp_noisy(params: dict, const: dict | None = None) -> dict[str, float]:
    c = const or K["llamacpp_noisy"]
    fa, n_batch = bool(params["flash_attn"]), int(params["n_batch"])
    if fa and n_batch >= c["crash_batch"] and params["type_k"] != params["type_v"]:
        raise SimFailure("CUDA error: an illegal memory access was encountered\n"
                         "  in ggml_cuda_flash_attn_ext (mixed K/V types, large ubatch)")
    return llamacpp_7b(params, c)


NOISE = {"llamacpp_noisy": 0.10}
# Each model's constants that bench/surfaces/families.py draws per instance (issue 41); these
# are the hand-written surfaces' own values (instance -1), so those surfaces are unchanged.
K: dict[str, dict[str, float]] = {
    "exl2_70b": {"ctx_gb": 0.75, "tp_gb": 1.1, "bw_eff": 0.78, "tp_sync_s": 45e-6, "alpha": 0.72,
                 "t_draft_s": 1.9e-3, "verify_k": 0.045, "flops_eff": 1.0, "ttft_ms": 18.0,
                 "draft_ttft": 1.0, "ppl_w": 1.0, "ppl_kv": 1.0},
    "streamer_70b": {"alpha_1b": 1.0, "alpha_8b": 1.0, "t_draft": 1.0, "ram_layers": RAM_LAYERS,
                     "ppl_skip": 6.5, "stream_A": 1.0, "stream_B": 1.0, "stream_C": 1.0,
                     "alpha_skip": 0.6},
    "llamacpp_7b": {"ctx_gb": 0.45, "no_fa_kv": 1.25, "ram_bw": 55e9, "bw_eff": 0.8, "dequant": 0.02,
                    "flops": 140e12, "pcie_bw": 24e9, "ppl_w": 1.0, "ppl_kv": 1.0},
    "cpu_7b": {"ram_bw": 38e9, "sat_threads": 5.0, "smt": 0.15, "core_flops": 25e9, "smt_cost": 0.05,
               "ppl_w": 1.0, **{f"k_{q}": 1.0 for q in CPU_QUANT_GB}},
    "vllm_h100": {"alpha_ngram": 1.0, "alpha_eagle": 1.0, "cost_ngram": 1.0, "cost_eagle": 1.0,
                  "graph_seq": 0.011, "act_tok": 0.00028, "bw_eff": 0.8, "chunk_stall": 0.15,
                  "ppl_w": 1.0, "ppl_kv": 1.0},
}
K["llamacpp_noisy"] = {**K["llamacpp_7b"], "crash_batch": 1024}
SURFACES = {"exl2_70b": exl2_70b, "streamer_70b": streamer_70b, "llamacpp_7b": llamacpp_7b,
            "cpu_7b": cpu_7b, "vllm_h100": vllm_h100, "llamacpp_noisy": llamacpp_noisy}
