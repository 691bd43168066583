"""End-of-study re-measurement: the top-k Pareto candidates and the baseline, side by side.

Search-time numbers come from one trial each, measured at different moments on a noisy
machine. Before naming a winner, the ``select.top_k`` best candidates (by the selection
rule) and the baseline are re-run ``select.rerun_repeats`` times, interleaved and in
alternating order, and the winner is chosen on those pooled numbers; a candidate whose
re-measured numbers break a constraint (or whose re-runs all failed) is dropped, and the
summary says why (``by_trial[n]["dropped"]``). The summary says
whether the winner's lead over the runner-up and over the baseline is within noise
(the bootstrap 95% CI of the difference of the medians contains 0).

A tail percentile from a handful of requests is nearly their maximum: one slow request (a
background job, a page fault) can break a ``ttft_p95_ms`` bound for a configuration whose
median is far inside it. Such a trial (:func:`tail_spikes`: every bound it broke is a p95/p99
at least ``SPIKE`` times its own median, which meets the bound) joins the re-measurement
when it would rank among the top candidates, and competes if its re-measured numbers hold.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from autotune.measure.stats import summarize
from autotune.measure.stats import within_noise
from autotune.objectives import get_metric
from autotune.record.optuna_study import constraint_values
from autotune.record.summary import Remeasured
from autotune.record.summary import RemeasuredRow
from autotune.record.summary import Verdict
from autotune.search.select import rank
from autotune.search.trials import Record

if TYPE_CHECKING:
    from autotune.config.schema import Config
    from autotune.objectives.goals import Constraint
    from autotune.output.report import Reporter
    from autotune.run.launcher import Launcher

REMEASURE_BASE = 1_000_000  # re-measurement run numbers: BASE + trial * 100 + repeat
RAW_KEYS = {"decode_tps": "decode_tps", "ttft_p50_ms": "ttft_ms"}
SPIKE = 2.0  # a broken p95/p99 at least this many times its median (which holds): one slow request
TAILS = ("_p95_", "_p99_")
SPEED_PREFIXES = ("decode_", "prefill_", "ttft_", "itl_", "tpot_", "e2e_", "aggregate_", "accept_",
                  "goodput_", "max_concurrency_at_slo", "max_rate_at_slo", "throughput_", "error_rate",
                  "fairness_", "max_context_", "mem_growth_")


def _samples(metric: str, runs: list[dict], raws: list[dict]) -> list[float]:
    key = RAW_KEYS.get(metric)
    if key and all(key in r for r in raws):
        return [x for r in raws for x in r[key]]
    return [m[metric] for m in runs if metric in m and math.isfinite(m[metric])]


def tail_spikes(records: list[Record], constraints: list[Constraint]) -> list[Record]:
    """The measured records that broke only tail-latency bounds, each by a spike: the broken
    percentile (p95/p99) is at least ``SPIKE`` times the same latency's median, and the median
    itself meets the bound. A slow configuration breaks the median too; a steady one near the
    bound has a tail close to its median."""
    out = []
    for rec in records:
        if rec.status != "ok" or rec.feasible:
            continue
        broken = [c for c in constraints if rec.violations.get(str(c), 0.0) > 0]
        if broken and all(_spike(c, rec.metrics) for c in broken):
            out.append(rec)
    return out


def _spike(c: Constraint, metrics: dict[str, float]) -> bool:
    tail = next((t for t in TAILS if t in c.metric), None)
    if tail is None or c.op != "<=":
        return False
    value, median = metrics.get(c.metric, math.nan), metrics.get(c.metric.replace(tail, "_p50_"), math.nan)
    return (math.isfinite(value) and math.isfinite(median) and median > 0 and c.violation(median) <= 0
            and value >= SPIKE * median)


def remeasure(launcher: Launcher, report: Reporter, configs: list[Record],
              repeats: int) -> dict[int, tuple[list[dict], list[dict]]]:
    """Re-run each config ``repeats`` times, interleaved; (metrics, raw samples) lists."""
    out: dict[int, tuple[list[dict], list[dict]]] = {r.number: ([], []) for r in configs}
    report.remeasure_plan(len(configs) * repeats)
    for rep in range(repeats):
        order = configs if rep % 2 == 0 else list(reversed(configs))
        for rec in order:
            number = REMEASURE_BASE + rec.number * 100 + rep
            res = launcher.run_now(number, rec.params, quality=False, tag="remeasure")
            report.remeasured(rec.number, rep, res)
            if res.ok:
                out[rec.number][0].append(res.metrics)
                out[rec.number][1].append(res.samples)
    return out


def _merge(rec: Record, runs: list[dict], raws: list[dict], cfg: Config) -> Record:
    """The record with its speed metrics replaced by medians over the re-runs: of the pooled
    per-request samples where the runs kept them (``RAW_KEYS``; the median the summary's table,
    CI and noise verdicts show), else of the runs' values."""
    if not runs:
        return replace(rec, feasible=False, reason="re-measurement failed")
    metrics = dict(rec.metrics)
    for key in {k for m in runs for k in m}:
        if key.startswith(SPEED_PREFIXES) or key in ("peak_rss_mb", "vram_peak_gb"):
            vals = _samples(key, runs, raws)
            if vals:
                metrics[key] = statistics.median(vals)
    if "roofline_tps" in metrics and "decode_tps" in metrics:  # the share of the re-measured speed
        metrics["roofline_pct"] = 100.0 * metrics["decode_tps"] / metrics["roofline_tps"]
    cons = constraint_values(cfg, metrics)
    return replace(rec, metrics=metrics, feasible=all(v <= 0 for v in cons.values()), violations=cons)


def choose_winner(cfg: Config, launcher: Launcher, report: Reporter, candidates: list[Record],
                  baseline: Record | None, suspects: Sequence[Record] = ()) -> Verdict:
    """Pick the winner among ``candidates`` on re-measured numbers, with noise verdicts.
    ``suspects`` (:func:`tail_spikes`) that would rank among the top candidates are
    re-measured with them and compete when their re-measured numbers hold."""
    sel = cfg.select
    objectives = [o.metric for o in cfg.objectives]
    ranked = rank(candidates, sel.rule, sel.metric, objectives, sel.weights)
    if sel.top_k == 0 or sel.rerun_repeats == 0 or not (ranked or suspects):
        return Verdict(winner=ranked[0]) if ranked else Verdict(
            note="nothing to export as a winner")
    top = ranked[: sel.top_k]
    contenders = rank([*top, *suspects], sel.rule, sel.metric, objectives, sel.weights)[: sel.top_k]
    in_top = {c.number for c in top}
    spiked = [r for r in contenders if r.number not in in_top]
    for r in spiked:
        report.note(f"trial #{r.number} {r.broken()}, a spike over its median: re-measured with the candidates")
    top = top + spiked
    configs = top + ([baseline] if baseline and baseline.status == "ok"
                     and baseline.number not in {c.number for c in top} else [])
    report.note(f"re-measuring trials {[c.number for c in configs]} x{sel.rerun_repeats}, interleaved")
    runs = remeasure(launcher, report, configs, sel.rerun_repeats)
    merged = {r.number: _merge(r, *runs[r.number], cfg) for r in configs}
    pool = [merged[c.number] for c in top if merged[c.number].feasible]
    if (baseline is not None and baseline.number in merged and baseline.feasible
            and merged[baseline.number].feasible and baseline.number not in {r.number for r in pool}):
        pool.append(merged[baseline.number])  # once: it may be among the top already
    if not pool:
        return Verdict(winner=ranked[0] if ranked else None,
                       note="re-measurement left no feasible candidate" + ("; winner from the search" if ranked else ""))
    final = rank(pool, sel.rule, sel.metric, objectives, sel.weights)
    winner = final[0]
    samples = {n: _samples(sel.metric, *runs[n]) for n in runs}
    rows = []
    for n, s in samples.items():
        stats, rec = summarize(s), merged[n]  # dropped: why it was not in the final ranking
        dropped = "" if rec.feasible else rec.broken() or rec.reason or "infeasible"
        rows.append(RemeasuredRow(str(n), stats.median, (stats.ci_low, stats.ci_high), len(s), dropped))
    kw: dict = {"winner": winner, "remeasured": Remeasured(sel.metric, tuple(rows))}
    if baseline is not None and baseline.number in merged:
        kw["baseline_remeasured"] = merged[baseline.number]
    if len(final) > 1:
        kw["lead_within_noise"] = within_noise(samples[winner.number], samples[final[1].number])
        kw["runner_up"] = final[1].number
    if baseline is not None and baseline.number in samples and samples[baseline.number]:
        b = summarize(samples[baseline.number]).median
        w = summarize(samples[winner.number]).median
        kw["speedup"] = get_metric(sel.metric).speedup(w, b)
        if kw["speedup"] is not None:
            kw["speedup_source"] = "re-measured side by side"
            if winner.number != baseline.number:  # the baseline won: no lead to judge
                kw["speedup_within_noise"] = within_noise(samples[winner.number], samples[baseline.number])
    return Verdict(**kw)
