"""The startup design: a space-filling set of valid configurations measured before the model.

Instead of random startup trials, a scrambled Sobol sequence (``scipy.stats.qmc``) over the
encoded space is mapped to parameter values and ``when`` conditions are applied; points that
break a rule or fail the engine's check are dropped, as are points the engine predicts will
not fit. Without a speed prior the design takes the valid points in Sobol order (``SPREAD``),
after what is already queued (trial 0, ``study.enqueue``, which count towards
``study.n_startup``). When the engine predicts a decode-speed upper bound for every point, and
the bounds differ, the design is picked greedily to be as far as possible from what is queued
and from each other (maximin), part of it among the fastest-predicted points, and runs
fastest-predicted first.
Before that spread, the design shows every level of each unordered, non-numeric categorical
knob and both branches of each conditional knob at least once (:func:`covering`, issue 41),
so the model never starts blind to a whole branch of the space.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

from optuna.distributions import CategoricalDistribution
from optuna.distributions import IntDistribution
from scipy.stats import qmc

from autotune.search.space import DIGITS
from autotune.search.space import decode
from autotune.search.space import encode
from autotune.search.trials import trial_attrs

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from autotune.search.space import Param
    from autotune.search.space import Space

MAX_DRAWS = 4096  # Sobol points examined at most (a heavily ruled space keeps few of them)
POOL = 256  # valid, distinct points the design is picked from
# With a known speed bound everywhere, the fastest-predicted third holds FAST_PART of the design
# and the rest spreads over every fitting configuration. bo takes the bound as its prior with a
# fitted trust, and a design confined to where the bound is high cannot show where it is wrong
# (the streamer's bound counts every drafted token as accepted). bench/efficiency.py, median
# trials to 95% of the optimum for bo over 20 seeds, exl2/streamer/llamacpp/cpu: fastest third
# only 13/12/9.5/10.5, half and half 10/11.5/9/12.5 (cpu's bound is right, so it pays).
# Those figures predate issue 23: the priors then carried the simulators' own constants, and
# the seeds (100-119) are now the report set. Not re-tuned since. A 4-trial startup without a
# prior (np4 in bench/results/robust.txt) first measured within seed noise (18 of 30 no-prior
# tune studies against 16); re-measured on today's sampler and on ten more seeds, it was kept
# (NO_PRIOR_STARTUP below).
FAST_SHARE = 1 / 3
FAST_PART = {"bo": 0.5, "tpe": 1.0, "gp": 1.0}
# Without a speed prior (no predict block, so no bound), a single-objective bo search measures at
# most NO_PRIOR_STARTUP trials (trial 0 and the design) before its model proposes: the design
# then carries no knowledge, and its maximin points sit at the space's corners, where engines
# crash or break a constraint (exl2_70b's TTFT bound holds only with tensor parallelism and a
# short draft). bench/efficiency.py --fast, mode none, 20 trials, studies at 95% of the optimum
# by trial 20 on exl2_70b / llamacpp_7b / vllm_h100, a startup of 6 (before) against 4:
# tune seeds 0-9 6/9/2 against 9/10/0 (3: 4/10/2); seeds 10-19, outside the tune and report
# sets, 5/10/0 against 9/10/0. vllm_h100's median best at trial 20: 0.898 against 0.752 on
# seeds 0-9, 0.787 against 0.784 on 10-19. bench/results/robust.txt.
NO_PRIOR_STARTUP = 4
# Issue 41: before the model is trusted, the design shows every level of each unordered
# categorical knob whose choices are not numbers (a GPU split, a speculative method, a bool
# such as flash attention) and both branches of each conditional knob (active / not) at least
# once, however few trials the startup has: a model that never measured a level cannot tell
# it hides the optimum. Each covering point is a valid, fitting configuration holding the
# level: the one covering most missing levels, then the highest predicted speed bound (a
# prior chooses among a level's points, never whether the level is shown), else the one
# nearest the baseline (plausible values for the other knobs). At most COVER_MAX points;
# COVER = False turns it off (bench/efficiency.py --variant nocover).
COVER = True
COVER_MAX = 8
COVER_NEAR = True  # without a prior: the holder nearest trial 0 (False: farthest from all queued)
# A lazy cover for a single-objective bo search without a prior (COVER_LAZY): the design covers
# only as many targets as its own n points hold (covering points replace spread ones; the
# startup is not lengthened), and bo shows a level still missing on every second model ask
# (asks 1, 3, 5, ...), the holder its acquisition ranks first: plausible values for the other
# knobs by what was measured, not by nearness to trial 0. Every level and branch is shown by
# trial n_startup + 2m - 2, m the levels the design left (a level nothing launchable holds is
# skipped). Tune instances (bench/efficiency.py --families all --split tune, 1000-1005, no
# prior, 20 trials; bench/results/efficiency.txt "2026-11-27, issue 41 items 3-4"): 25 of 40
# at 95% by trial 20 against 24 for the eager cover, the gain on exl2_70b only (the one family
# whose levels outnumber its design); exl2_70b 1000-1017: 15/15 against 13/15, worst decile
# 0.969 against 0.000. False: the eager cover (bench variant eagercover).
COVER_LAZY = True
# How the design spreads its points without a speed prior (SPREAD): "sobol", the valid Sobol points
# in sequence order (a scrambled Sobol prefix is balanced, so a thread count or batch size is shown
# at interior values, not only at its ends); "maximin" (before session 24), each next point the
# farthest from those queued, which puts them at the space's corners. A CPU box's best thread
# count sits inside its range, and with corners only (1 and 16 threads) the GP read a rise from
# 1 to 16 and never tried 8 (bench cpu_7b, tune instance 1000). bench/efficiency.py --families all,
# no prior, 20 launched trials, studies at 95% of the optimum by trial 20, maximin against sobol:
# tune instances 1000-1009 42/65 against 50/65 (cpu_7b 2/7 -> 5/7, vllm_h100 2 -> 5, streamer_70b
# 5 -> 8, llamacpp_noisy 10 -> 9, moe_30b 6 -> 5); held out 5000-5005 24/40 against 28/40 (cpu_7b
# 1/5 -> 5/5, llamacpp_noisy 4 -> 6, vllm_h100 0 -> 2, streamer_70b 6 -> 2, moe_30b 3 -> 2); the
# hand-written surfaces' report seeds 100-119, 102/140 against 103/140. Seed by seed over the
# three sets 31 studies won, 20 lost (bench/results/efficiency.txt, session 24). With a prior
# the design is ordered by the predicted bound, as before.
SPREAD = "sobol"
_ON, _OFF = "<active>", "<inactive>"


def ranks_by_speed(bounds: list[float | None]) -> bool:
    """Whether predicted decode-speed bounds can rank configurations: every one known and
    positive, and not all equal. A bound the same everywhere (llama-server's weights-over-
    RAM-bandwidth bound, which ``parallel`` and ``threads`` do not enter) is no prior."""
    known = [b for b in bounds if b is not None and b > 0]
    return bool(known) and len(known) == len(bounds) and max(known) > min(known) * (1 + 1e-9)


def has_speed_prior(space: Space, seed: int | None,
                    screen: Callable[[dict[str, Any]], tuple[bool, float | None]]) -> bool:
    """Whether the engine's bounds rank the design's candidate points (:func:`ranks_by_speed`)."""
    return ranks_by_speed([upper for fits, upper in map(screen, _pool(space, seed, set())) if fits])


def default_n_startup(n_trials: int) -> int:
    """Startup trials (trial 0 and enqueued configs included) for a budget of ``n_trials``."""
    return min(n_trials, max(3, min(8, n_trials // 4 + 1)))


def config_key(params: dict[str, Any]) -> str:
    """A configuration's identity (duplicates have the same key)."""
    return json.dumps(params, sort_keys=True, default=str)


def trial_params(t: FrozenTrial) -> dict[str, Any]:
    """A trial's configuration: what the driver stored, else Optuna's params."""
    return trial_attrs(t).params or {k: decode(v) for k, v in t.params.items()}


def trial_keys(trials: list[FrozenTrial]) -> dict[int, str]:
    """Each trial's :func:`config_key`, by trial number."""
    return {t.number: config_key(trial_params(t)) for t in trials}


def from_unit(p: Param, u: float) -> Any:
    """Map ``u`` in [0, 1) to a value of parameter ``p`` (uniform in its encoded scale)."""
    d = p.dist
    if d is None:
        return p.value
    if isinstance(d, CategoricalDistribution) or p.values() is not None and not getattr(d, "log", False):
        vals = p.values()
        return vals[min(int(u * len(vals)), len(vals) - 1)]
    lo, hi = (math.log(d.low), math.log(d.high)) if d.log else (d.low, d.high)
    x = lo + u * (hi - lo)
    x = math.exp(x) if d.log else x
    if isinstance(d, IntDistribution):
        return max(d.low, min(d.high, int(round(x))))
    return round(x, DIGITS)


def to_unit(p: Param, value: Any) -> float:
    """Position of ``value`` in [0, 1] on ``p``'s encoded scale (inverse of :func:`from_unit`)."""
    d = p.dist
    vals = p.values()
    if d is None or len(vals or ()) == 1:
        return 0.0
    if isinstance(d, CategoricalDistribution) or vals is not None and not getattr(d, "log", False):
        return vals.index(value) / (len(vals) - 1) if value in vals else 0.0
    if d.log:
        return (math.log(value) - math.log(d.low)) / (math.log(d.high) - math.log(d.low))
    return (value - d.low) / (d.high - d.low)


def distance(space: Space, a: dict[str, Any], b: dict[str, Any]) -> float:
    """Euclidean distance on the encoded scale; a choice differs by 1, an inactive knob too."""
    total = 0.0
    for p in space.params.values():
        if p.dist is None or (p.name not in a and p.name not in b):
            continue
        if (p.name in a) != (p.name in b):
            gap = 1.0
        elif isinstance(p.dist, CategoricalDistribution):
            gap = float(encode(a[p.name]) != encode(b[p.name]))
        else:
            gap = to_unit(p, a[p.name]) - to_unit(p, b[p.name])
        total += gap * gap
    return math.sqrt(total)


def _pool(space: Space, seed: int | None, seen: set[str]) -> list[dict[str, Any]]:
    """Valid, distinct Sobol points (rules and engine check applied), in sequence order."""
    dims = [p for p in space.params.values() if p.dist is not None]
    if not dims:
        return []
    fixed = {p.name: p.value for p in space.params.values() if p.dist is None}
    sobol = qmc.Sobol(d=len(dims), scramble=True, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # balance properties: we take a prefix on purpose
        points = sobol.random(MAX_DRAWS)
    out = []
    for u in points:
        params = space.restrict({**{p.name: from_unit(p, float(x)) for p, x in zip(dims, u)}, **fixed})
        key = config_key(params)
        if key in seen or space.violations(params):
            continue
        seen.add(key)
        out.append(params)
        if len(out) == POOL:
            break
    return out


def cover_targets(space: Space) -> list[tuple[str, Any]]:
    """The (knob, level) pairs a design must show (see COVER): each level of an unordered
    categorical or bool knob whose choices are not all numbers, each branch of a conditional one."""
    out: list[tuple[str, Any]] = []
    for p in space.params.values():
        if p.dist is None:
            continue
        if p.when is not None:
            out += [(p.name, _ON), (p.name, _OFF)]
        if isinstance(p.dist, CategoricalDistribution) and not p.ordered:
            vals = p.values() or []
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
                out += [(p.name, v) for v in vals]
    return out


def shows(params: dict[str, Any], target: tuple[str, Any]) -> bool:
    """Whether a configuration holds a (knob, level) target of :func:`cover_targets`."""
    name, level = target
    if level == _ON:
        return name in params
    if level == _OFF:
        return name not in params
    return name in params and encode(params[name]) == encode(level)


def covering(space: Space, pool: list[dict[str, Any]], queued: list[dict[str, Any]],
             bound: dict[str, float | None] | None, cap: int = COVER_MAX) -> list[dict[str, Any]]:
    """Up to ``cap`` configurations of ``pool`` (valid, fitting) that show every target of
    :func:`cover_targets` no ``queued`` one shows; ``bound``: predicted speed bounds by
    :func:`config_key` (a prior) or None. Each pick covers the most missing targets, then has
    the highest bound, else lies nearest the first queued configuration (the baseline)."""
    missing = [t for t in cover_targets(space) if not any(shows(q, t) for q in queued)]
    anchor = queued[0] if queued else None
    chosen: list[dict[str, Any]] = []
    pool = list(pool)
    while missing and pool and len(chosen) < cap:
        holders = [c for c in pool if shows(c, missing[0])]
        if not holders:  # no valid, fitting configuration holds it
            missing.pop(0)
            continue

        def rank(c: dict[str, Any], missing: list[tuple[str, Any]] = missing) -> tuple[int, float]:
            if bound:
                plausible = bound.get(config_key(c)) or 0.0
            elif COVER_NEAR:
                plausible = -(distance(space, c, anchor) if anchor is not None else 0.0)
            else:
                plausible = min((distance(space, c, q) for q in [*queued, *chosen]), default=0.0)
            return sum(shows(c, t) for t in missing), plausible

        pick = max(holders, key=rank)
        pool.remove(pick)
        chosen.append(pick)
        missing = [t for t in missing if not shows(pick, t)]
    return chosen


def startup_design(space: Space, n: int, seed: int | None, queued: list[dict[str, Any]],
                   screen: Callable[[dict[str, Any]], tuple[bool, float | None]],
                   fast_part: float = 1.0, lazy: bool = False) -> list[dict[str, Any]]:
    """Up to ``n`` valid, distinct, spread-out configurations, none equal to one in ``queued``,
    after the :func:`covering` ones (more than ``n`` when the levels to show need more).

    ``screen(params)`` returns (may run, predicted decode tok/s upper bound or None). When the
    bound is known for every point, ``fast_part`` of the design is picked among the fastest-
    predicted third of the fitting points (the rest among all of them), and the design is
    ordered by the bound, highest first. ``lazy``: the sampler shows what the design leaves
    unshown (a single-objective ``bo`` search: see COVER_LAZY).
    """
    if n <= 0:
        return []
    screened = [(params, *screen(params)) for params in _pool(space, seed, {config_key(q) for q in queued})]
    pool = [params for params, fits, _ in screened if fits]
    bound = {config_key(params): upper for params, fits, upper in screened if fits}
    fast = set(bound)
    ranked_by_bound = ranks_by_speed(list(bound.values()))
    cap = min(COVER_MAX, n) if lazy and COVER_LAZY and not ranked_by_bound else COVER_MAX
    cover = covering(space, pool, queued, bound if ranked_by_bound else None, cap) if COVER else []
    if cover:
        keys = {config_key(c) for c in cover}
        pool = [c for c in pool if config_key(c) not in keys]
        queued, n = [*queued, *cover], n - len(cover)
    if ranked_by_bound:
        ranked = sorted(bound.values(), reverse=True)
        cut = ranked[min(len(ranked), max(n, int(len(ranked) * FAST_SHARE))) - 1]
        fast = {k for k, upper in bound.items() if upper >= cut}
    n_fast = math.ceil(n * fast_part)
    chosen: list[dict[str, Any]] = []
    nearest = [min((distance(space, c, q) for q in queued), default=math.inf) for c in pool]
    while pool and len(chosen) < n:
        picks = [j for j, c in enumerate(pool) if len(chosen) >= n_fast or config_key(c) in fast] \
            or range(len(pool))
        if SPREAD == "sobol" and not ranked_by_bound:  # the valid Sobol points in sequence order
            i = min(picks)
        else:
            i = max(picks, key=lambda j: (nearest[j], -j))  # farthest; ties: Sobol order
        params = pool.pop(i)
        nearest.pop(i)
        chosen.append(params)
        nearest = [min(d, distance(space, c, params)) for c, d in zip(pool, nearest)]
    chosen = [*cover, *chosen]
    if chosen and ranked_by_bound:
        chosen.sort(key=lambda p: -bound[config_key(p)])
    return chosen
