"""The noise-free truth of a simulated surface: every configuration of its preset's space.

:func:`load` reads ``bench/surfaces/<name>.yaml``, enumerates the space (categorical
choices, bools, int ranges; a float range on its ``step``, else on a grid of
:data:`FLOAT_GRID`; a conditional parameter is left out where its ``when`` is false), applies the preset's rules (autotune's own rule evaluator) and
constraints to the model's noise-free metrics, and returns a :class:`Truth` that knows the
true feasible optimum and the true value of any configuration.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
import sys
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import families  # noqa: E402
from models import SimFailure  # noqa: E402

NOISE_SLACK = 0.03  # a timing constraint within the noise of its bound is met (or the surface's noise)
FLOAT_GRID = 0.01  # the truth of a continuous knob: evaluated on this grid (the optimum's)
TIMED = ("ttft_p50_ms", "ttft_p95_ms", "decode_tps")
OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}
_CONSTRAINT = re.compile(r"^\s*(\w+)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")


def parse_constraints(items: list[str]) -> list[tuple[str, str, float]]:
    out = []
    for text in items:
        m = _CONSTRAINT.match(str(text))
        if not m:
            raise ValueError(f"constraint {text!r}: expected 'metric <= number'")
        out.append((m.group(1), m.group(2), float(m.group(3))))
    return out


def satisfies(metrics: dict, constraints: list[tuple[str, str, float]]) -> bool:
    return all(k in metrics and math.isfinite(metrics[k]) and OPS[op](metrics[k], v)
               for k, op, v in constraints)


def enumerate_space(space: dict) -> list[dict]:
    """Every configuration; a parameter whose ``when`` is false is absent (deduplicated)."""
    from autotune._expr import compile_expr

    names, values, whens = list(space), [], {}
    for i, name in enumerate(names):
        d = space[name]
        if "when" in d:
            whens[name] = compile_expr(d["when"], names[:i], f"space.{name}.when")
        if d["type"] == "categorical":
            values.append(list(d["choices"]))
        elif d["type"] == "bool":
            values.append([False, True])
        elif d["type"] == "int":
            values.append(list(range(int(d["low"]), int(d["high"]) + 1, int(d.get("step", 1)))))
        elif d["type"] == "float":
            low, high = float(d["low"]), float(d["high"])
            step = float(d.get("step") or FLOAT_GRID)
            values.append([round(low + j * step, 10) for j in range(int(round((high - low) / step)) + 1)])
        elif d["type"] == "fixed":
            values.append([d["value"]])
        else:
            raise ValueError(f"space.{name}: the bench enumerates categorical, bool, int and float")
    out, seen = [], set()
    for combo in itertools.product(*values):
        params = dict(zip(names, combo))
        for name, when in whens.items():
            if name in params and not when.holds(params):
                del params[name]
        k = key(params)
        if k not in seen:
            seen.add(k)
            out.append(params)
    return out


def key(params: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in params.items()))


@dataclass
class Truth:
    """True metrics, feasibility and the feasible optimum of one surface."""

    name: str
    preset: dict
    metric: str
    constraints: list[tuple[str, str, float]]
    rules: list = field(default_factory=list)
    table: dict[tuple, float] = field(default_factory=dict)  # key -> true value (0 infeasible)
    optimum: float = 0.0
    n_configs: int = 0
    n_feasible: int = 0
    n_within95: int = 0
    n_launchable: int = 0  # neither rule-broken nor predicted OOM by the preset's declaration
    n_launchable95: int = 0
    instance: int = -1  # the family's instance (bench/surfaces/families.py); -1: the surface itself

    def __post_init__(self) -> None:
        self.model = families.model(self.name, self.instance)
        self.noise = families.noise(self.name, self.instance)

    @property
    def label(self) -> str:
        return self.name if self.instance < 0 else f"{self.name}#{self.instance}"

    def evaluate(self, params: dict) -> tuple[float, dict | None, str]:
        """(true value or 0, noise-free metrics, why infeasible)."""
        from autotune.search.rules import violations

        broken = violations(self.rules, params)
        if broken:
            return 0.0, None, "rule: " + broken[0]
        try:
            metrics = self.model(params)
        except SimFailure as e:
            return 0.0, None, str(e)
        if not satisfies(metrics, self.constraints):
            return 0.0, metrics, "violates a constraint"
        return float(metrics[self.metric]), metrics, ""

    def credit(self, params: dict) -> float:
        """True value of a configuration the search measured as feasible: its true metric if
        it truly meets every constraint within the timing noise (3%), else 0."""
        try:
            metrics = self.model(params)
        except SimFailure:
            return 0.0
        slack = max(NOISE_SLACK, self.noise)
        loose = [(k, op, v * (1 + slack) if op.startswith("<") else v * (1 - slack))
                 if k in TIMED else (k, op, v) for k, op, v in self.constraints]
        if not satisfies(metrics, loose):
            return 0.0
        return float(metrics[self.metric])

    def value(self, params: dict) -> float:
        """True value of a configuration (0 when it is truly infeasible)."""
        k = key({n: params[n] for n in self.preset["space"] if params.get(n) is not None})
        if k not in self.table:
            self.table[k] = self.evaluate(params)[0]
        return self.table[k]


def load(name: str, instance: int = -1, launchable: bool = True) -> Truth:
    """Enumerate the surface's (or its family's ``instance``'s) space and compute its true
    feasible optimum; ``launchable``: count what the physics prior lets launch too (slow)."""
    from autotune.search.rules import compile_rule

    preset = yaml.safe_load((HERE / f"{name}.yaml").read_text())
    known = list(preset["space"])
    rules = [compile_rule(r, known, f"rules[{i}]") for i, r in enumerate(preset.get("rules") or [])]
    metric = (preset.get("select") or {}).get("metric", "decode_tps")
    truth = Truth(name, preset, metric, parse_constraints(preset.get("constraints") or []), rules,
                  instance=instance)
    from autotune.engines.command import CommandEngine
    from autotune.search.rules import violations

    fits = []
    settings = preset["engine"]["settings"]
    for params in enumerate_space(preset["space"]):
        k = key(params)
        truth.table[k] = truth.evaluate(params)[0]
        if launchable and not violations(rules, params) and CommandEngine.predict(params, settings, {}).fits is not False:
            fits.append(truth.table[k])
    values = list(truth.table.values())
    truth.n_configs = len(values)
    truth.optimum = max(values)
    truth.n_feasible = sum(v > 0 for v in values)
    truth.n_within95 = sum(v >= 0.95 * truth.optimum for v in values)
    truth.n_launchable = len(fits)
    truth.n_launchable95 = sum(v >= 0.95 * truth.optimum for v in fits)
    return truth
