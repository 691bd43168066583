"""Family instances in the efficiency bench (issue 41): the tune / held-out split and its tables.

``bench/efficiency.py --families F,... --split tune|report`` runs each method on instances of
each family (``bench/surfaces/families.py``): instance seeds TUNE (1000-4999: look at these
while changing the sampler) or REPORT (5000-8999: held out, run once the sampler is fixed),
disjoint. A study on instance i uses i as its study seed and its noise seed too, so every
method meets the same instances under the same noise. Per family x prior mode x method:
the share of instances at 95% of the instance's true optimum by trial 20 with its Wilson 95%
interval, the median best@20, the worst decile's best@20 (the 10th percentile), the median
trials to 95%; and per family where the instances' optima sit (:func:`families.structure`).
"""

from __future__ import annotations

import math
import random
from collections import Counter

from stats import _median
from stats import _n
from stats import wilson

SPLITS = {"tune": range(1000, 5000), "report": range(5000, 9000)}
TRIALS_AT = 20


def split_of(seed: int) -> str:
    """'i-tune' or 'i-held' for an instance seed, '' otherwise."""
    if seed in SPLITS["tune"]:
        return "i-tune"
    return "i-held" if seed in SPLITS["report"] else ""


def decile(values: list[float]) -> float:
    """The 10th percentile (nearest rank): the best@20 that 90% of the studies reach."""
    if not values:
        return math.nan
    ranked = sorted(values)
    return ranked[max(0, math.ceil(0.1 * len(ranked)) - 1)]


MODE_ORDER = {"none": 0, "physics": 1, "misleading": 2}
METHOD_ORDER = {"default": 0, "default:nocover": 1, "tpe": 2, "gp": 3, "random": 4}


def family_rows(runs: list) -> list[dict]:
    """One row per family x split x mode x method (``runs``: efficiency.Run of instance studies),
    in the order the runs name the families."""
    keys = list(dict.fromkeys((r.surface, r.set, r.mode, r.method) for r in runs))
    order = {f: i for i, f in enumerate(dict.fromkeys(r.surface for r in runs))}
    keys.sort(key=lambda k: (order[k[0]], k[1], MODE_ORDER.get(k[2], 9), METHOD_ORDER.get(k[3], 9), k[3]))
    rows = []
    for key in keys:
        ok = [r for r in runs if (r.surface, r.set, r.mode, r.method) == key and r.curve]
        if not ok:  # only instances where nothing is feasible: nothing to score
            continue
        hits = sum(r.trials_to(0.95) <= TRIALS_AT for r in ok)
        at = [r.at(TRIALS_AT) for r in ok]
        rows.append({"family": key[0], "set": key[1], "mode": key[2], "method": key[3], "n": len(ok),
                     "hits": hits, "p95": hits / max(len(ok), 1), "ci": wilson(hits, len(ok)),
                     "median": _median(at), "worst10": decile(at),
                     "trials95": _median(sorted(r.trials_to(0.95) for r in ok))})
    return rows


def family_table(rows: list[dict], shapes: dict[str, list[dict]]) -> str:
    """Plain-text table of :func:`family_rows` and where each family's instances' optima sit."""
    head = (f"{'family':15} {'set':7} {'prior':10} {'method':16} {'n':>3} {'95% by 20 [Wilson 95%]':>24} "
            f"{'median@20':>9} {'worst10%@20':>11} {'trials to 95%':>13}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lo, hi = r["ci"]
        share = f"{r['hits']}/{r['n']} {r['p95']:.0%} [{lo:.0%}, {hi:.0%}]"
        lines.append(f"{r['family']:15} {r['set']:7} {r['mode']:10} {r['method']:16} {r['n']:>3} {share:>24} "
                     f"{r['median']:>9.3f} {r['worst10']:>11.3f} {_n(r['trials95']):>13}")
    if shapes:
        lines += ["", "where the instances' optima sit (edge; levels of the categorical knobs, the branch):"]
        for family, items in shapes.items():
            lines.append(f"  {family} ({len(items)} instances): " + "; ".join(
                f"{k} " + ", ".join(f"{v} {c}" for v, c in Counter(s[k] for s in items).most_common())
                for k in items[0]))
    return "\n".join(lines) + "\n"


def smoke_runs(families: list[str], instances: int, trials: int, run_cls) -> tuple[list, dict]:
    """In-process uniform random search over the rule-abiding configurations of a few tune
    instances of each family, scored against each instance's truth (seconds; checks the
    generators, the truths and the scoring, not a sampler). ([run_cls], {family: shapes})."""
    import families as fam
    from truth import enumerate_space
    from truth import load

    from autotune.search.rules import violations

    runs, shapes = [], {}
    for family in families:
        shapes[family] = []
        for seed in list(SPLITS["tune"])[:instances]:
            truth = load(family, seed, launchable=False)
            shapes[family].append(fam.structure(truth))
            allowed = [p for p in enumerate_space(truth.preset["space"]) if not violations(truth.rules, p)]
            best, curve = 0.0, []
            for p in random.Random(seed).sample(allowed, min(trials, len(allowed))):
                best = max(best, truth.value(p))
                curve.append(min(best / truth.optimum, 1.0))
            runs.append(run_cls(family, "random", seed, 0, 0.0, tuple(curve), None, mode="none", via="smoke"))
    return runs, shapes
