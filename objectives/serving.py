"""Serving metrics: load, goodput at an SLO, fairness, limits, multi-turn and long context.

Each is declared once with its unit and direction; docs/metrics.md says how each is
computed and at which load level (the workload's fixed level, or the highest level of
the SLO search that met the SLO).
"""

from __future__ import annotations

from autotune.objectives._registry import register_metric

# ---- load and goodput ------------------------------------------------------------------
register_metric("throughput_rps", "req/s", "maximize",
                "finished requests / wall time of the measured level")
register_metric("error_rate", "", "minimize",
                "failed requests / all requests of the measured level (0-1)")
register_metric("max_concurrency_at_slo", "users", "maximize",
                "highest closed-loop concurrency whose requests met the SLO (0: none did)")
register_metric("max_rate_at_slo", "req/s", "maximize",
                "highest Poisson arrival rate whose requests met the SLO (0: none did)")
register_metric("goodput_rps", "req/s", "maximize",
                "requests meeting every per-request SLO bound / wall time, best level meeting the SLO")
register_metric("goodput_tps", "tok/s", "maximize",
                "output tokens of requests meeting the per-request SLO / wall time, best level")

# ---- fairness and limits ---------------------------------------------------------------
register_metric("fairness_jain", "", "maximize",
                "Jain's index of per-user output tok/s at the measured level (1 = equal)")
register_metric("ttft_user_spread_ms", "ms", "minimize",
                "max - min over concurrent users of each user's median TTFT")
register_metric("oom_at_concurrency", "users", "maximize",
                "lowest concurrency at which a request ran out of memory")
register_metric("reject_at_concurrency", "users", "maximize",
                "lowest concurrency at which the engine rejected a request (HTTP 429/503)")

# ---- multi-turn ------------------------------------------------------------------------
register_metric("ttft_turn1_ms", "ms", "minimize", "median TTFT of the first turn of the conversations")
register_metric("ttft_last_turn_ms", "ms", "minimize", "median TTFT of the last turn (full history)")
register_metric("ttft_growth_pct", "%", "minimize",
                "100 * (median TTFT of the last turn / of turn 1 - 1)")
register_metric("decode_tps_growth_pct", "%", "maximize",
                "100 * (median decode tok/s of the last turn / of turn 1 - 1); negative = slower")
register_metric("mem_growth_mb_per_turn", "MB", "minimize",
                "(memory after the last turn - after turn 1) / (turns - 1): peak RSS or VRAM")

# ---- long context ----------------------------------------------------------------------
register_metric("max_context_tokens", "tokens", "maximize",
                "most prompt + output tokens a request held at the longest ladder step that worked")
