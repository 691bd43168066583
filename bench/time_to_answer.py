"""Time to an answer (issue 43): the wall-clock until a study holds a configuration within 95%
of the optimum, and the wall-clock of its whole budget, before and after issue 43.

Each study is the real driver loop and sampler on a simulated surface, in process
(bench/surfaces/fast.py), with a placement that keeps a **virtual clock**: nothing sleeps, each
trial adds what its steps would cost on the machine the surface models (``COSTS``: for a 70B,
a load of 60-90 s, a workload of 60 s and a perplexity pass of 30 s). The workload is measured
in its stages as the worker does: per-request samples (the trial's measured numbers, each
request scattered by ``REQUEST_NOISE``), judged after the first batch and after the whole
workload by the worker's own rule (:func:`autotune.measure.early_stop.verdict`, with the rule
the driver sent: the incumbent, the constraints). A trial stopped after the first batch costs
its load and that part of the workload; one stopped after the workload skips the quality pass.
A trial whose quality key (the surface's ``QUALITY_KNOBS``: what changes its logits) was
measured reuses it and skips the quality pass (``quality.reuse``). A crash costs its load; the
end-of-study re-measurement costs a load and a workload per run, in both methods.

Methods: ``before`` is the code before issue 43 (``study.early_stop=false``, no quality reuse,
every trial at full cost); the others stop early and reuse quality, each with its own early-stop
rule (``--rule``, ``RULES``: the knobs of :mod:`autotune.measure.early_stop`): ``now`` the
shipped defaults, ``issue43`` the first rule (a bootstrap CI of the median, no run-to-run
noise), the rest variants measured while tuning it; ``RULE/LEVERS`` (``--levers``) runs a rule with
other levers than the product ships (``LEVERS``: "refuse", the driver refusing a proposal whose
measured quality breaks a quality bound, shipped; "qslice" and "qfirst", the quality pass or a
first slice of it before the workload for a new quality key; "warm" and "sweep", estimates of
keeping the engine loaded across per-request knobs: modelled here, not built). All see the same paired noise (the
surfaces' ``noise_seed``): they differ only in what they stop and what they charge. Not modelled: the driver's own time (bo's pool build stalled 230 s once per
study before issue 43's header cache), which would only widen the gap.

Per surface and method: seeds reaching 95% of the optimum by the end of the budget (with its
Wilson 95% interval), median [quartiles] hours to 95% over those seeds, the ratio of the
medians, the median [quartiles] hours of the whole budget, the trials stopped early per study
and how many of those stops the truth disproves (stopped on the incumbent while truly better
than it, or on a bound while truly feasible), per study and in all.

    python bench/time_to_answer.py --seeds 100 --first-seed 100          # the report set
    python bench/time_to_answer.py --first-seed 1000 --seeds 12 --no-before --levers none,shipped,refuse+qslice
    python bench/time_to_answer.py --smoke                               # CI: 2 seeds, 8 trials
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import multiprocessing
import random
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "surfaces"))
sys.path.insert(0, str(ROOT))

from fast import SimPlacement  # noqa: E402
from fast import fast_study  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from stats import _quartiles  # noqa: E402
from stats import wilson  # noqa: E402
from truth import Truth  # noqa: E402
from truth import load  # noqa: E402
from truth import satisfies  # noqa: E402

# surface -> (load low s, load high s, workload s, quality pass s)
COSTS = {"exl2_70b": (60.0, 90.0, 60.0, 30.0), "streamer_70b": (60.0, 90.0, 60.0, 30.0),
         "llamacpp_7b": (10.0, 20.0, 30.0, 15.0)}
# the knobs that change the output distribution (a draft with greedy verification does not)
QUALITY_KNOBS = {"exl2_70b": ("bpw", "cache_mode"), "streamer_70b": ("skip_threshold", "kv_type"),
                 "llamacpp_7b": ("quant", "type_k", "type_v")}
METHODS = {"before": ["study.early_stop=false"], "issue43": []}
# --rule: the early-stop rule variants run beside "before" (autotune.measure.early_stop's knobs);
# "issue43" is the first rule (a bootstrap CI of the median), "now" the shipped defaults
RULES = {
    "issue43": {"INTERVAL": "bootstrap", "RUN_NOISE": 0.0, "MIN_OBJECTIVE_SAMPLES": 2},
    "t": {"INTERVAL": "t", "RUN_NOISE": 0.0, "MIN_OBJECTIVE_SAMPLES": 2},
    "t-run": {"INTERVAL": "t", "RUN_NOISE": 1.0, "MIN_OBJECTIVE_SAMPLES": 2},
    "t-run-half": {"INTERVAL": "t", "RUN_NOISE": 0.5, "MIN_OBJECTIVE_SAMPLES": 2},
    "t-run-whole": {"INTERVAL": "t", "RUN_NOISE": 1.0, "MIN_OBJECTIVE_SAMPLES": 5},
    "issue43-whole": {"INTERVAL": "bootstrap", "RUN_NOISE": 0.0, "MIN_OBJECTIVE_SAMPLES": 5},
    "now": {},
}
# --levers: what else a method does beside its rule (each a '+'-joined set of these; "shipped":
# the product's defaults). "refuse": the driver refuses a proposal whose quality key was measured
# and breaks a quality bound (autotune.run.quality_memo); "qslice": a trial measuring a new
# quality key under a quality bound runs a first slice of the quality pass (QSLICE of it) before
# its workload and stops when the bound is broken beyond noise, else measures the whole pass after
# the workload as before (the slice is paid twice); "qfirst": the whole quality pass before the
# workload (stopped there when broken; never skipped after a stop on the workload)
# "warm" (an estimate for lever 4, not built): a trial whose knobs equal the previous trial's but
# for the per-request ones (PER_REQUEST: what a server takes in the request body, as llama-server's
# speculative.n_max) runs on the engine still loaded and pays no load
# "sweep" (an estimate, with "warm"): after a trial measured whole, the driver measures the
# per-request knob's neighbours (SWEEP_STEP either side) on the same load, enqueued next
LEVERS = ("refuse", "qslice", "qfirst", "warm", "sweep")
SWEEP_STEP = 2
PER_REQUEST = {"exl2_70b": ("draft_k",), "streamer_70b": ("draft_k",), "llamacpp_7b": ()}
SHIPPED = ("refuse",)
QSLICE = 0.25  # of the quality pass (quality.n_tokens): 128 of 512 tokens
QSLICE_SE = 0.15  # the slice's standard error, relative to the true ppl delta, plus QSLICE_SE_ABS
QSLICE_SE_ABS = 0.2  # percentage points (a paired per-token estimate on 128 tokens)
REQUEST_NOISE = 0.03  # per-request scatter around the trial's measured numbers (log-normal sigma)
LEVEL = 0.95


def _unit(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16) / 16**12


class ClockedPlacement(SimPlacement):
    """SimPlacement with a virtual clock: each run adds its steps' costs; stages and quality
    reuse as the issue-43 worker and driver do them (``reuse``)."""

    def __init__(self, surface: str, reuse: bool, levers: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.surface, self.reuse, self.levers = surface, reuse, levers
        self.load_lo, self.load_hi, self.workload_s, self.quality_s = COSTS[surface]
        self.clock = 0.0
        self.ends: dict[int, float] = {}  # search trial -> clock when it finished
        self.loads: dict[int, float] = {}  # search trial -> what its load cost (the floor's part)
        self.measured_keys: set[str] = set()
        self.held: str | None = None  # "warm": the loaded engine's knobs, but the per-request ones

    def _load_s(self, params: dict) -> float:
        config = repr(sorted((k, str(v)) for k, v in params.items()))
        return self.load_lo + (self.load_hi - self.load_lo) * _unit(f"{self.surface}|{config}")

    def run_now(self, spec, res):
        from autotune.measure.early_stop import first_batch
        from autotune.measure.early_stop import verdict

        result = super().run_now(spec, res)
        load = self._load_s(spec.params)
        search = Path(spec.workdir).parent.name == "trials"
        if search and "warm" in self.levers:  # an estimate: the engine kept loaded between trials
            held = repr(sorted((k, str(v)) for k, v in spec.params.items() if k not in PER_REQUEST[self.surface]))
            if result.ok and held == self.held:
                load = 0.0
            self.held = held if result.ok else None  # a crash takes the engine with it
        if not result.ok:
            self.clock += load
        elif not search:  # the re-measurement: a load and a workload, never stopped
            self.clock += load + self.workload_s
        else:
            result = self._staged(spec, result, load, first_batch, verdict)
        if search:
            self.ends[spec.number] = self.clock
            self.loads[spec.number] = load
        return result

    def _staged(self, spec, result, load, first_batch, verdict):
        m = result.metrics
        n = spec.workload.repeats * spec.workload.concurrency
        seed = (spec.settings.get("vars") or {}).get("noise_seed")  # paired: the config and the seed
        rng = random.Random(f"{self.surface}|{sorted((k, str(v)) for k, v in spec.params.items())}|{seed}")
        dec = [m["decode_tps"] * rng.lognormvariate(0.0, REQUEST_NOISE) for _ in range(n)]
        ttft = [m["ttft_p50_ms"] * rng.lognormvariate(0.0, REQUEST_NOISE) for _ in range(n)]
        key = repr([spec.params.get(q) for q in QUALITY_KNOBS[self.surface]])
        new_key = not (self.reuse and key in self.measured_keys)
        qbounds = [(mt, op, b) for mt, op, b in (spec.early_stop.bounds if spec.early_stop else ())
                   if mt == "ppl_delta_pct"]
        first = None  # the quality stage run before the workload: "qslice" or "qfirst"
        if new_key and qbounds and "ppl_delta_pct" in m:
            first = "qfirst" if "qfirst" in self.levers else "qslice" if "qslice" in self.levers else None
        if first:
            frac = 1.0 if first == "qfirst" else QSLICE
            load += self.quality_s * frac
            true = m["ppl_delta_pct"]
            se = 0.0 if first == "qfirst" else QSLICE_SE * abs(true) + QSLICE_SE_ABS
            got = true + se * rng.gauss(0.0, 1.0)
            for _, op, b in qbounds:
                slack = 0.05 * abs(b)
                if (op == "<=" and got - 1.96 * se > b + slack) or (op == ">=" and got + 1.96 * se < b - slack):
                    self.clock += load
                    if first == "qfirst":
                        self.measured_keys.add(key)
                    return result.replace(status="stopped", metrics={"ppl_delta_pct": round(got, 4)}, reason=(
                        f"stopped early: ppl_delta_pct {op} {b:g} broken beyond noise: {got:.3g} "
                        f"on the first {frac:.0%} of the quality text"))
            if first == "qfirst":
                self.measured_keys.add(key)
        k = first_batch(n)
        timed = {"decode_tps": statistics.median(dec[:k]), "ttft_p50_ms": statistics.median(ttft[:k]),
                 "ttft_p95_ms": max(ttft[:k])}
        why = verdict(spec.early_stop, timed, {"decode_tps": dec[:k], "ttft_ms": ttft[:k]}) if k else None
        timed |= {"ppl_delta_pct": m["ppl_delta_pct"]} if first == "qfirst" else {}  # measured: kept
        if why:
            self.clock += load + self.workload_s * k / n
            return result.replace(status="stopped", reason=why, metrics=timed)
        self.clock += load + self.workload_s
        speed = {q: v for q, v in m.items() if q != "ppl_delta_pct" or first == "qfirst"}  # before the pass
        why = verdict(spec.early_stop, speed, {"decode_tps": dec, "ttft_ms": ttft})
        if why:
            return result.replace(status="stopped", reason=why, metrics=speed)
        if new_key and first != "qfirst":
            self.clock += self.quality_s
            self.measured_keys.add(key)
        return result


_TRUTHS: dict[str, Truth] = {}  # filled before the worker processes fork


def _rule(method: str) -> dict:
    """The early-stop knobs of a method (``before``: none, it never stops)."""
    from autotune.measure import early_stop

    if method not in RULES:
        return {}
    return {name: getattr(early_stop, name) for name in ("INTERVAL", "RUN_NOISE", "MIN_OBJECTIVE_SAMPLES")} \
        | RULES[method]


def levers_of(method: str) -> tuple[str, ...]:
    """The levers of a method: ``RULE`` (the shipped ones), ``RULE/none`` or ``RULE/a+b``."""
    if method == "before":
        return ()
    _, _, text = method.partition("/")
    if not text or text == "shipped":
        return SHIPPED
    return () if text == "none" else tuple(text.split("+"))


@contextlib.contextmanager
def _memo(surface: str, levers: tuple[str, ...], reuse: bool):
    """The driver's quality memo as on an engine whose own quality pass a trial may skip (the
    simulated surfaces run the command engine, whose presets here declare no quality_knobs,
    with quality.enabled false: their ppl_delta_pct comes with every result): keyed on
    ``QUALITY_KNOBS``; "refuse" off: no refusal."""
    from autotune.run import driver as driverlib
    from autotune.run import quality_memo

    saved = quality_memo.quality_key, quality_memo.QualityMemo.__init__, quality_memo.QualityMemo.breaks

    def init(self, cfg, engine):
        saved[1](self, cfg, engine)
        self.on = self.reuses = reuse  # as an engine whose own quality pass a trial may skip

    quality_memo.quality_key = lambda engine, params, settings, variants: repr(
        [params.get(q) for q in QUALITY_KNOBS[surface]])
    quality_memo.QualityMemo.__init__ = init
    if "refuse" not in levers:
        quality_memo.QualityMemo.breaks = lambda self, params: None
    finish = driverlib.Driver._finish_one
    if "sweep" in levers:
        driverlib.Driver._finish_one = lambda self, study, p, result: _sweep(surface, finish, self, study, p, result)
    try:
        yield
    finally:
        quality_memo.quality_key, quality_memo.QualityMemo.__init__, quality_memo.QualityMemo.breaks = saved
        driverlib.Driver._finish_one = finish


def _sweep(surface: str, finish, driver, study, p, result):
    """"sweep": a trial measured whole enqueues its per-request knob's neighbours (run next, warm)."""
    record = finish(driver, study, p, result)
    if record.status == "ok" and p.trial.number > 0 and p.trial.user_attrs.get("role") != "sweep":
        for knob in PER_REQUEST[surface]:
            spec = driver.space.params[knob]
            for v in (p.params[knob] - SWEEP_STEP, p.params[knob] + SWEEP_STEP):
                if spec.dist.low <= v <= spec.dist.high:
                    study.enqueue_trial({**p.params, knob: v}, user_attrs={"role": "sweep"})
    return record


def one(truth: Truth | str, method: str, seed: int, trials: int) -> dict:
    """One study: hours to 95% of the optimum (inf: never), hours of the whole budget.
    ``method``: a rule with its levers, and ``:VARIANT`` a search variant (``--variant``)."""
    from efficiency import set_variant

    from autotune.measure import early_stop

    truth = _TRUTHS[truth] if isinstance(truth, str) else truth
    plain, _, variant = method.partition(":")
    set_variant(variant)
    levers = levers_of(plain)
    placement = ClockedPlacement(truth.name, reuse=plain != "before", levers=levers)
    saved = _rule("now")
    for name, value in _rule(plain.partition("/")[0]).items():
        setattr(early_stop, name, value)
    try:
        with _memo(truth.name, levers, reuse=plain != "before"):
            done, _, _ = fast_study([f"conf={truth.name}", f"study.seed={seed}", f"study.n_trials={trials}",
                                     f"engine.settings.vars.noise_seed={seed}", *METHODS.get(plain, [])],
                                    placement=placement)
    finally:
        for name, value in saved.items():
            setattr(early_stop, name, value)
        set_variant("")
    best, reached, hit = -math.inf, math.inf, None
    for t in done:  # launch order: the configuration the study would pick after each trial
        if t["status"] == "ok" and satisfies(t["metrics"], truth.constraints) and t["metrics"][truth.metric] > best:
            best = t["metrics"][truth.metric]
            if truth.credit(t["params"]) >= LEVEL * truth.optimum and reached == math.inf:
                reached, hit = placement.ends[t["number"]], t["number"]
    # the floor: the same path with every launch before the hit costing its load alone (a perfect
    # early stop), the hit its load, workload and quality pass
    before = [n for n, end in placement.ends.items() if hit is not None and end <= reached]
    floor = (sum(placement.loads[n] for n in before) + placement.workload_s + placement.quality_s
             if hit is not None else math.inf)
    return {"surface": truth.name, "method": method, "seed": seed, "to95_h": reached / 3600,
            "floor_h": floor / 3600, "launches_to95": len(before) if hit is not None else None,
            "total_h": placement.clock / 3600, "stopped": sum(t["status"] == "stopped" for t in done),
            "lost": sum(wrong_stop(truth, t, done) for t in done)}


def wrong_stop(truth: Truth, t: dict, done: list[dict]) -> bool:
    """A stop the truth disproves: stopped on the incumbent while truly better than it, or on a
    bound while truly feasible (within the timing noise, ``Truth.credit``)."""
    if t["status"] != "stopped":
        return False
    by = re.search(r"incumbent .* \(trial #(\d+)\)", t["reason"])
    if by is None:  # a bound
        return truth.credit(t["params"]) > 0
    incumbent = next(d for d in done if d["number"] == int(by.group(1)))
    return truth.credit(t["params"]) > truth.credit(incumbent["params"])


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    lo, hi = _quartiles(values)
    return f"{statistics.median(values):.2f} [{lo:.2f}-{hi:.2f}]"


def table(rows: list[dict], surfaces: list[str], methods: list[str]) -> Table:
    t = Table(title=f"time to {LEVEL:.0%} of the optimum (virtual clock, hours)")
    for col in ("surface", "method", "seeds", f"reached {LEVEL:.0%} [Wilson]", f"hours to {LEVEL:.0%}",
                "ratio", "floor: earlier launches cost their load", "launches to 95%", "hours, whole budget", "ratio ",
                "stopped early / study",
                "wrong / study", "wrong (truly better)"):
        t.add_column(col)
    for s in surfaces:
        med = {"before": (math.nan, math.nan)}
        for method in methods:
            rs = [r for r in rows if r["surface"] == s and r["method"] == method]
            hit = [r["to95_h"] for r in rs if math.isfinite(r["to95_h"])]
            med[method] = (statistics.median(hit) if hit else math.nan,
                           statistics.median([r["total_h"] for r in rs]) if rs else math.nan)
            lo, hi = wilson(len(hit), len(rs))
            ratio = ["1" if method == "before" else "-" if math.isnan(med["before"][i] / med[method][i])
                     else f"{med['before'][i] / med[method][i]:.2f}x" for i in (0, 1)]
            floor = [r["floor_h"] for r in rs if math.isfinite(r.get("floor_h", math.inf))]
            launches = [float(r["launches_to95"]) for r in rs if r.get("launches_to95") is not None]
            t.add_row(s, method, str(len(rs)), f"{len(hit)}/{len(rs)} [{lo:.2f}-{hi:.2f}]", _fmt(hit), ratio[0],
                      _fmt(floor), _fmt(launches).replace(".00", ""),
                      _fmt([r["total_h"] for r in rs]), ratio[1],
                      f"{statistics.mean([r['stopped'] for r in rs]):.1f}" if rs else "-",
                      f"{statistics.mean([r['lost'] for r in rs]):.2f}" if rs else "-",
                      f"{sum(r['lost'] for r in rs)} in {sum(r['lost'] > 0 for r in rs)} seeds")
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--surfaces", default="exl2_70b,streamer_70b", help="comma-separated (COSTS)")
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--first-seed", type=int, default=100, help="100-: the report seeds")
    ap.add_argument("--trials", type=int, default=30, help="the budget, study.n_trials")
    ap.add_argument("--jobs", type=int, default=1, help="studies run at once (processes)")
    ap.add_argument("--smoke", action="store_true", help="2 seeds, 8 trials, one surface; writes nothing")
    ap.add_argument("--rule", default="now", help=f"comma-separated early-stop rules run beside 'before' "
                    f"({', '.join(RULES)}; 'now': the shipped defaults, 'issue43': the first rule)")
    ap.add_argument("--levers", default="shipped", help=f"comma-separated lever sets run with each rule "
                    f"('+'-joined from {', '.join(LEVERS)}; 'none'; 'shipped': {'+'.join(SHIPPED)})")
    ap.add_argument("--no-before", action="store_true", help="skip 'before' (the ratios then read '-')")
    ap.add_argument("--rows", type=Path, default=None, help="append each study's row here (JSON lines); "
                    "rows already there are not run again")
    ap.add_argument("--out", type=Path, default=None, help="write the table here (with the command)")
    ap.add_argument("--variant", default="base", help="comma-separated search variants (bench/efficiency.py "
                    "VARIANTS, 'base': the defaults), each run with every method; rows read METHOD:VARIANT")
    args = ap.parse_args(argv)
    surfaces = ["exl2_70b"] if args.smoke else args.surfaces.split(",")
    seeds = range(args.first_seed, args.first_seed + (2 if args.smoke else args.seeds))
    trials = 8 if args.smoke else args.trials
    t0 = time.monotonic()
    for s in surfaces:
        _TRUTHS[s] = load(s, launchable=False)
    methods = ([] if args.no_before else ["before"]) + [
        rule if lv == "shipped" else f"{rule}/{lv}" for rule in args.rule.split(",") for lv in args.levers.split(",")]
    from efficiency import VARIANTS

    variants = args.variant.split(",")
    if bad := [v for v in variants if v not in ("", "base", *VARIANTS)]:
        ap.error(f"unknown --variant {', '.join(bad)}; known: base, {', '.join(VARIANTS)}")
    methods = [m if v in ("", "base") else f"{m}:{v}" for v in variants for m in methods]
    unknown = [m for m in methods if m != "before" and m.partition(":")[0].partition("/")[0] not in RULES]
    if unknown:
        ap.error(f"unknown --rule {', '.join(unknown)}; known: {', '.join(RULES)}")
    bad = [lv for m in methods for lv in levers_of(m.partition(":")[0]) if lv not in LEVERS]
    if bad:
        ap.error(f"unknown --levers {', '.join(bad)}; known: {', '.join(LEVERS)} ('+'-joined), none, shipped")
    jobs = [(s, method, seed, trials) for s in surfaces for seed in seeds for method in methods]
    kept = [json.loads(line) for line in args.rows.read_text().splitlines()] \
        if args.rows is not None and args.rows.exists() else []
    done = {(r["surface"], r["method"], r["seed"]) for r in kept}
    jobs = [job for job in jobs if job[:3] not in done]
    if args.jobs > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            rows = pool.starmap(one, jobs, chunksize=1)
    else:
        rows = []
        for job in jobs:  # each study's row kept as it ends (--rows): a run cut off resumes there
            rows.append(one(*job))
            if args.rows is not None:
                with args.rows.open("a") as f:
                    f.write(json.dumps(rows[-1]) + "\n")
    rows = [r for r in kept if r["surface"] in surfaces and r["method"] in methods and r["seed"] in seeds] + rows
    console = Console(record=True, width=160, file=None if args.out is None else io.StringIO())
    console.print(table(rows, surfaces, methods))
    console.print(f"{len(rows)} studies, {trials} trials each, seeds {seeds.start}-{seeds.stop - 1}; "
                  f"{time.monotonic() - t0:.0f} s")
    if args.out is not None:
        cmd = "python bench/time_to_answer.py " + " ".join(argv if argv is not None else sys.argv[1:])
        args.out.write_text(f"$ {cmd}\n\n{console.export_text()}")
        print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
