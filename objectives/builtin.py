"""Built-in metrics measured by autotune's trial worker.

Definitions (also in docs/metrics.md):
- TTFT: time from submitting a request to the first generated token (includes prefill
  and queueing). ITL: gap between consecutive generated tokens. TPOT: (e2e - TTFT) /
  (output tokens - 1), the mean time per output token after the first.
- decode tok/s: (output tokens - 1) / (time of last token - time of first token), with the
  token count taken from the engine's own counters, never from streamed chunks.
- prefill tok/s: prompt tokens / TTFT.
"""

from __future__ import annotations

from objectives._registry import register_distribution
from objectives._registry import register_metric

register_metric("decode_tps", "tok/s", "maximize", "decode tokens/s, median over repeats")
register_metric("decode_tps_cv", "%", "minimize", "coefficient of variation of decode tok/s")
register_metric("prefill_tps", "tok/s", "maximize", "prompt tokens / TTFT, median over repeats")
register_metric("aggregate_tps", "tok/s", "maximize", "output tokens/s summed over concurrent requests")
register_distribution("ttft", "ms", "minimize", "time to first token")
register_distribution("itl", "ms", "minimize", "inter-token latency")
register_distribution("tpot", "ms", "minimize", "time per output token after the first")
register_distribution("e2e", "ms", "minimize", "end-to-end request latency")
register_metric("peak_rss_mb", "MB", "minimize", "peak resident memory of the trial process")
register_metric("vram_peak_gb", "GB", "minimize", "peak GPU memory summed over the trial's GPUs")
register_metric("mem_estimate_mb", "MB", "minimize", "model + KV cache estimate before launch")
register_metric("load_s", "s", "minimize", "time to load the model")
register_metric("ppl", "", "minimize", "perplexity on the study's fixed text")
register_metric("ppl_delta", "", "minimize", "perplexity minus the reference's")
register_metric("ppl_delta_pct", "%", "minimize", "perplexity change vs the reference, in %")
register_metric("kld_mean", "nats", "minimize", "mean KL(reference || trial) of next-token dists")
register_metric("kld_p99", "nats", "minimize", "99th percentile of the per-token KLD")
register_metric("same_top_pct", "%", "maximize", "tokens whose top-1 prediction matches the reference")
register_metric("accept_rate", "", "maximize", "accepted / proposed draft tokens")
register_metric("greedy_match", "", "maximize", "1 if greedy output equals the no-speculation output")
