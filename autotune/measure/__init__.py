"""Measurement: workloads and timings, statistics, quality vs a reference.

- ``spec``: ``WorkloadSpec`` / ``QualitySpec``, what a trial measures (the config sections).
- ``types``: ``Generation`` and the ``Generator`` protocol, all measure/ knows of an engine.
- ``workload``: runs a workload in the form it declares (fixed load, SLO search, ladder).
- ``timings``: per-request TTFT, ITL, TPOT, decode / prefill tok/s, e2e -> metrics.
- ``load``: closed-loop users and Poisson arrivals, failed-request kinds, goodput, fairness.
- ``levels``: one load level of a workload and its metrics; ``slo``: the most load that
  meets the SLO; ``ladder``: long prompts up to the trial's context.
- ``conversations``: single-turn, mixed-length (seeded) and multi-turn sessions.
- ``prompts``: the shipped prompt sets and user prompt files.
- ``stats``: medians, percentiles, MAD, CV, bootstrap CIs and ``within_noise``.
- ``quality``: perplexity, KLD and same-top-1 vs a cached reference.

The shipped prompt sets are made by ``python -m autotune.tools.promptgen``.
"""
