"""Built-in metrics measured by autotune's trial worker, each declared once.

Exact definitions are in docs/metrics.md. In short, per request with times from submit:
TTFT = first output chunk; ITL = gap between consecutive output chunks; TPOT = (e2e -
TTFT) / (output tokens - 1); decode tok/s = (output tokens - 1) / (last chunk - first
chunk); prefill tok/s = prompt tokens / TTFT; token counts are the engine's own, never
the number of streamed chunks. A trial reports the median over its measured repeats
(warm-up excluded); distributions also report p95, p99 and the MAD.
"""

from __future__ import annotations

from autotune.objectives._registry import register_distribution
from autotune.objectives._registry import register_metric

# ---- speed -----------------------------------------------------------------------------
register_metric("decode_tps", "tok/s", "maximize",
                "(output tokens - 1) / (last - first output chunk time), median over requests")
register_metric("decode_tps_cv", "%", "minimize",
                "coefficient of variation (sd/mean, ddof=1) of per-request decode tok/s")
register_metric("prefill_tps", "tok/s", "maximize", "prompt tokens / TTFT, median over requests")
register_metric("aggregate_tps", "tok/s", "maximize",
                "all output tokens / wall time of the measured requests (summed over concurrency)")
register_distribution("ttft", "ms", "minimize", "time to first token: submit -> first chunk")
register_distribution("itl", "ms", "minimize", "inter-token latency: gap between output chunks")
register_distribution("tpot", "ms", "minimize",
                      "time per output token after the first: (e2e - TTFT) / (tokens - 1)")
register_distribution("e2e", "ms", "minimize", "end-to-end request latency: submit -> last token")
register_metric("load_s", "s", "minimize", "time to load the model (engine.start)")

# ---- memory ----------------------------------------------------------------------------
register_metric("peak_rss_mb", "MB", "minimize",
                "peak resident memory (VmHWM) of the trial process, before quality eval")
register_metric("vram_peak_gb", "GiB", "minimize",
                "peak used GPU memory summed over the trial's GPUs, less the idle reading "
                "(NVML v2 used memory, as nvidia-smi shows it; GiB, 50 ms sampling)")
register_metric("vram_free_gb", "GiB", "maximize",
                "GPU memory free at the trial's start, summed over its GPUs (NVML total less the "
                "idle reading): a vram_peak_gb at it means the trial filled the cards")
register_metric("mem_estimate_mb", "MB", "minimize",
                "estimate before launch from the GGUF header: weights + KV + logits + runtime")

# ---- quality vs the study's reference --------------------------------------------------
register_metric("ppl", "", "minimize", "perplexity exp(mean NLL) on the study's fixed text")
register_metric("ppl_delta", "", "minimize", "perplexity minus the reference's (same tokens)")
register_metric("ppl_delta_pct", "%", "minimize", "100 * (ppl - reference ppl) / reference ppl")
register_metric("kld_mean", "nats", "minimize",
                "mean over positions of KL(reference || trial) of next-token distributions")
register_metric("kld_p99", "nats", "minimize", "99th percentile of the per-position KLD")
register_metric("same_top_pct", "%", "maximize",
                "positions whose top-1 next token equals the reference's, in %")

# ---- speculative decoding --------------------------------------------------------------
register_metric("accept_rate", "", "maximize", "accepted / proposed draft tokens")
register_metric("greedy_match", "", "maximize",
                "1.0 if greedy token ids equal a re-run without the drafter (1.0 with no drafter)")
