"""Measurement: workloads and timings, statistics, quality vs a reference, memory.

- ``workload``: the shared timing loop (TTFT, ITL, TPOT, decode / prefill tok/s, e2e).
- ``stats``: medians, percentiles, MAD, CV, bootstrap CIs and ``compare_runs``.
- ``quality``: perplexity, KLD and same-top-1 vs a cached reference.
- ``memory``: the GGUF-header memory estimate and peak RSS.
- ``promptgen``: how the shipped prompt sets were generated.
"""
