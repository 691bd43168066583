"""``bo``'s pool: the launchable configurations of a space, one feature row each.

Every configuration of the space (a random sample of a continuous or huge one) that passes
the rules, the engine's check and its pre-launch fit prediction. Features: a numeric value
(a two-way choice, or choices the space declares ``ordered``) by its position on the
parameter's scale, other choices one-hot, a conditional parameter's activity as its own
column. A sampled pool grows: the trials measured outside it join it, and :meth:`Pool.grow`
adds configurations near the best measured ones (:mod:`autotune.search.refine`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any

import numpy as np
from optuna.distributions import CategoricalDistribution

from autotune.search.design import config_key
from autotune.search.design import ranks_by_speed
from autotune.search.design import to_unit
from autotune.search.space import encode

if TYPE_CHECKING:
    from autotune.search.space import Param
    from autotune.search.space import Space

POOL_LIMIT = 100_000  # a larger space (or a continuous one) is represented by 4,000 random configurations
MAX_SIZE = 50_000  # a sampled pool stops growing near the best measured at this many rows


@dataclass
class Pool:
    """The launchable configurations, one feature row each, and the log of their predicted
    decode-speed bound (None unless the engine predicts one for every configuration, and
    they differ: :func:`autotune.search.design.ranks_by_speed`).

    When it is a sample of its space (``space`` and ``screen`` given), :meth:`grow` adds
    configurations near the best measured ones (:mod:`autotune.search.refine`)."""

    params: list[dict[str, Any]]
    keys: list[str]
    X: np.ndarray
    log_bound: np.ndarray | None
    space: Space | None = None
    screen: Callable[[dict[str, Any]], tuple[bool, float | None]] | None = None
    index: dict[str, int] = field(default_factory=dict)
    tried: set[str] = field(default_factory=set)  # keys offered to grow(), kept or not
    max_size: int = MAX_SIZE  # grow() adds no neighbours past this many rows
    ordered: bool = True  # choices declared ``ordered`` are one position (False: one-hot, as any choice)
    expect: Callable[[dict[str, Any]], dict[str, float]] | None = None  # a configuration's expected metrics

    def __post_init__(self) -> None:
        self.index = {k: i for i, k in enumerate(self.keys)}
        self._numbers: dict[str, np.ndarray] = {}
        self._expected: dict[str, np.ndarray | None] = {}

    def expected(self, metric: str) -> np.ndarray | None:
        """What the engine's prediction expects ``metric`` to read per row (its ``expect``), kept
        and extended as the pool grows; None when the prediction of the first row expects nothing
        of it (then no row is asked again)."""
        if self.expect is None or not self.params:
            return None
        have = self._expected.get(metric, np.zeros(0))
        if have is not None and not len(have):
            first = self.expect(self.params[0])
            have = self._expected[metric] = np.array([first[metric]], dtype=float) if metric in first else None
        if have is None:
            return None
        expect = self.expect
        self._expected[metric] = have = self._extended(have, lambda c: expect(c).get(metric, np.nan))
        return have

    def numbers(self, name: str) -> np.ndarray:
        """Knob ``name``'s value per row as a float (NaN where it is inactive or not a number),
        kept and extended as the pool grows: a per-ask filter over every row costs one numpy
        comparison instead of a Python call per configuration."""
        self._numbers[name] = have = self._extended(self._numbers.get(name, np.zeros(0)), lambda c: (
            v if isinstance(v := c.get(name), (int, float)) and not isinstance(v, bool) else np.nan))
        return have

    def _extended(self, have: np.ndarray, value_of: Callable[[dict[str, Any]], float]) -> np.ndarray:
        """A per-row column ``have`` extended by ``value_of`` the rows added since it was made."""
        if len(have) == len(self.params):
            return have
        return np.concatenate([have, np.array([value_of(c) for c in self.params[len(have):]], dtype=float)])

    def grow(self, configs: list[dict[str, Any]], measured: bool = False) -> int:
        """Add those of ``configs`` that are new, break no rule and pass the screen (with a
        bound when the pool has bounds); ``measured`` ones need only the bound. Returns how
        many were added."""
        if self.space is None or self.screen is None or (len(self.keys) >= self.max_size and not measured):
            return 0
        new, bounds = [], []
        for c in configs:
            key = config_key(c)
            if key in self.index or (key in self.tried and not measured):
                continue
            self.tried.add(key)
            if not measured and self.space.violations(c):
                continue
            fits, bound = self.screen(c)
            if (fits or measured) and (self.log_bound is None or (bound is not None and bound > 0)):
                new.append(c)
                bounds.append(bound)
        if not new:
            return 0
        for c in new:
            self.index[config_key(c)] = len(self.keys)
            self.keys.append(config_key(c))
            self.params.append(c)
        self.X = np.vstack([self.X, featurize(self.space, new, self.ordered)])
        if self.log_bound is not None:
            self.log_bound = np.concatenate([self.log_bound, np.log(np.array(bounds, dtype=float))])
        return len(new)


def _ordered(p: Param, declared: bool = True) -> bool:
    """Whether ``p``'s values have an order the model may use (numbers, two choices, or, when
    ``declared``, choices the space declares ``ordered``)."""
    vals = p.values()
    if (declared and p.ordered) or vals is None or not isinstance(p.dist, CategoricalDistribution) or len(vals) <= 2:
        return True
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)


def uses_order(search: str) -> bool:
    """Whether a study's pool puts choices declared ``ordered`` on one scale: not in a Pareto
    search, whose second objective (TTFT, VRAM) need not follow the order speed does (on
    bench/pareto.py's tune seeds the ordered scale lost there: bench/results/robust.txt)."""
    return search != "pareto"


def featurize(space: Space, configs: list[dict[str, Any]], ordered: bool = True) -> np.ndarray:
    """One row of features per configuration (see the module docstring); ``ordered``: whether
    choices the space declares ``ordered`` are one position (else one-hot)."""
    cols: list[list[float]] = []
    for p in space.params.values():
        if p.dist is None:
            continue
        if _ordered(p, ordered):
            cols.append([to_unit(p, c[p.name]) if p.name in c else 0.0 for c in configs])
        else:
            for v in p.values():
                cols.append([float(p.name in c and encode(c[p.name]) == encode(v)) for c in configs])
        if p.when is not None:
            cols.append([float(p.name in c) for c in configs])
    return np.array(cols, dtype=float).T if cols else np.zeros((len(configs), 1))


def build_pool(space: Space, screen: Callable[[dict[str, Any]], tuple[bool, float | None]],
               seed: int | None = None, limit: int = POOL_LIMIT, ordered: bool = True,
               expect: Callable[[dict[str, Any]], dict[str, float]] | None = None) -> Pool:
    """Every launchable configuration: no rule broken, the engine's check passed and
    ``screen(params)`` -> (may run, predicted decode bound or None) saying it may run.
    ``ordered``: see :func:`featurize` (a Pareto search passes False); ``expect(params)``: the
    metrics the engine's prediction expects (:meth:`Pool.expected`)."""
    seen: set[str] = set()
    params, bounds = [], []
    for c in space.configurations(limit=limit, seed=seed or 0):
        key = config_key(c)
        if key in seen:
            continue
        seen.add(key)
        if space.violations(c):
            continue
        fits, bound = screen(c)
        if fits:
            params.append(c)
            bounds.append(bound)
    known = ranks_by_speed(bounds)
    sampled = space.size() > limit  # a sample of the space: it grows near the best measured
    return Pool(params, [config_key(c) for c in params], featurize(space, params, ordered),
                np.log(np.array(bounds, dtype=float)) if known else None,
                space if sampled else None, screen if sampled else None, ordered=ordered, expect=expect)
