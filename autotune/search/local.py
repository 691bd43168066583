"""The local search after the design (issue 41): edge probes along ordered knobs, a trust region.

The GP proposes by expected improvement over the whole pool. Two things it does badly are
done here, on some of its asks (:func:`turn`), from the best few measured-feasible points:

* **The edge search.** A memory-bound engine's optimum sits at the edge of what fits: the
  least offload, the largest batch or memory share that still runs, the cheapest quant the
  quality bound allows. Along an ordered knob (a number, or choices the space declares
  ``ordered``) the speed rises toward that edge and drops off (a crash, an OOM, a broken
  constraint, a spill that runs several times slower) just past it; a smooth model blurs the
  step. :func:`edge_probes` walks each ordered knob from a best point, the other knobs held,
  in the direction the model says is uphill, to the first value that is known or predicted
  bad: measured infeasible (failed launch, constraint broken), measured far below the point
  (a cliff), not launchable (the engine's check or fit prediction refuses it), or predicted
  infeasible by the feasibility models. It proposes the untried value halfway between (a
  bisection toward the edge), so the edge is pinned in a few probes. This is what a user
  knows of such engines, not where a given surface's edge is.
* **The trust region.** The candidates within ``TRUST_RADIUS`` (feature space) of the best
  ``CENTRES`` measured-feasible points, so a good region found late is refined, not left.

Both are off unless switched on (``EDGE``, ``TRUST``; bench/efficiency.py ``--variant``). On the
tune instances (bench/efficiency.py --families all --split tune --seeds 6 --modes none, 20
trials; bench/results/efficiency.txt "2026-11-27, issue 41 items 3-4") neither earned a place:
studies at 95% by trial 20, of 40, the default 24, edge probes every second ask 20 (every
fourth 23; measured edges only, 10 of 19 against 12), the trust region 24 (vllm_h100 +1,
cpu_7b -1), the trust region with the lazy cover 25 (the lazy cover alone 25). The probes
land where the model already looks on the families it solves, and on the MoE and vLLM
families the edge that matters moves with a choice made elsewhere (the quant, the speculative
method), so bisecting one knob from the best point found so far pins the wrong edge.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

import numpy as np
from optuna.distributions import CategoricalDistribution

from autotune.search import refine

if TYPE_CHECKING:
    from autotune.search.space import Param
    from autotune.search.space import Space

EDGE = False  # edge probes on local turns
TRUST = False  # trust-region proposals on local turns (after edge probes, when both are on)
EVERY = 2  # every EVERY-th model ask is a local turn (1: every ask)
CENTRES = 2  # the best measured-feasible points the local search starts from
CLIFF = 0.5  # a measured speed below CLIFF x the centre's counts as past an edge (a spill)
PF_EDGE = 0.5  # a predicted probability of feasibility below this counts as past an edge
MEASURED = False  # True: only a measured bad value (or a refused one) is an edge, not a predicted one
# Whether a probe's direction must be uphill by the model's mean. Off: toward the first bad
# value is taken as uphill (what fits is what is fast, up to the edge), and the acquisition
# ranks the probes.
UPHILL = False
TRUST_RADIUS = 0.6  # feature-space distance of the trust region (one-hot choices differ by 1.4)


def turn(ask: int) -> bool:
    """Whether model ask number ``ask`` (1, 2, ...) is a local turn."""
    return (EDGE or TRUST) and ask % EVERY == 0


def ordered_knobs(space: Space) -> list[Param]:
    """Knobs whose values have an order along which an edge can fall: numbers, and choices the
    space declares ``ordered``. Unordered choices and bools are the design's to cover."""
    out = []
    for p in space.params.values():
        if p.dist is None:
            continue
        vals = p.values()
        if isinstance(p.dist, CategoricalDistribution):
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals or ())
            if not (p.ordered or numeric) or len(vals or ()) < 3:
                continue
        out.append(p)
    return out


def line(space: Space, centre: dict[str, Any], p: Param) -> list[dict[str, Any]]:
    """``centre`` moved along knob ``p`` over its values in order (a long or continuous knob
    on refine's grid plus fine steps near the centre), the other knobs held; rule-breaking
    ones are left out. The centre itself is on the line."""
    if p.name not in centre:
        return []
    vals = p.values() if not refine._long(p) else refine._values(p, centre[p.name])
    vals = sorted(set([*vals, centre[p.name]]))
    out = []
    for v in vals:
        c = space.restrict({**centre, p.name: v})
        if c.get(p.name) == v and not space.violations(c):
            out.append(c)
    return out


@dataclass(frozen=True)
class Known:
    """What the search knows of one configuration on a line: measured (``value`` on the told
    scale, None when it failed or broke a constraint), or a prediction (``mean``, ``p_feasible``),
    or neither (``launchable`` False: the engine's check or fit prediction refuses it)."""

    measured: bool = False
    value: float | None = None
    mean: float = 0.0
    p_feasible: float = 1.0
    launchable: bool = True


def edge_probes(space: Space, centre: dict[str, Any], cliff: float,
                know: Callable[[dict[str, Any]], Known]) -> list[dict[str, Any]]:
    """Untried configurations halfway between ``centre`` (measured feasible) and the first bad
    value along each ordered knob, either way (see the module docstring and ``UPHILL``); ``cliff``: a measured value (told scale, higher is better) below it counts as
    bad. At most one per knob and direction."""
    out = []
    mean = know(centre).mean
    for p in ordered_knobs(space):
        pts = line(space, centre, p)
        at = next((i for i, c in enumerate(pts) if c.get(p.name) == centre.get(p.name)), None)
        if at is None:
            continue
        info = [know(c) for c in pts]
        for step in (-1, 1):
            if not 0 <= at + step < len(pts) or UPHILL and info[at + step].mean <= mean:
                continue  # the line's end (or, with UPHILL, the model's mean falls this way)
            edge = next((j for j in range(at + step, len(pts) if step > 0 else -1, step)
                         if _bad(info[j], cliff)), None)
            if edge is None:
                continue
            between = [i for i in range(at + step, edge, step) if not info[i].measured]
            if not between:
                continue  # next to the centre, or every value up to it measured: pinned
            mid = (at + edge) / 2
            out.append(pts[min(between, key=lambda i: (abs(i - mid), -abs(i - at)))])
    return out


def _bad(k: Known, cliff: float) -> bool:
    """Past an edge: not launchable, failed or broke a constraint, fell off a cliff, or
    predicted infeasible."""
    if not k.launchable:
        return True
    if k.measured:
        return k.value is None or k.value < cliff
    return not MEASURED and k.p_feasible < PF_EDGE


def near(X: np.ndarray, rows: np.ndarray, centres: np.ndarray, radius: float = TRUST_RADIUS) -> np.ndarray:
    """Which of ``rows`` of features ``X`` lie within ``radius`` of a ``centres`` row."""
    if not len(rows) or not len(centres):
        return np.zeros(len(rows), dtype=bool)
    d = np.sqrt(((X[rows][:, None, :] - X[centres][None, :, :]) ** 2).sum(axis=2))
    return d.min(axis=1) <= radius
