"""Compile the YAML search space into Optuna distributions, conditions and rules.

:func:`build_space` (for :func:`autotune.config.validate.compile_space`) checks each parameter
against the engine's knobs and each rule against the parameters, and returns a :class:`Space`.
``Space.suggest(trial)`` samples define-by-run: a parameter whose ``when`` is false is never
suggested (conditional parameters).
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import random
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any

from optuna.distributions import BaseDistribution
from optuna.distributions import CategoricalDistribution
from optuna.distributions import FloatDistribution
from optuna.distributions import IntDistribution

from autotune.engines.base import Engine
from autotune.engines.base import Knob
from autotune.errors import ConfigError
from autotune.errors import unknown_name
from autotune.registry import get_engine_class
from autotune.search.rules import Expr
from autotune.search.rules import Rule
from autotune.search.rules import compile_expr
from autotune.search.rules import compile_rule

if TYPE_CHECKING:
    import optuna


PARAM_TYPES = ("int", "float", "categorical", "bool", "fixed")
_KEYS = {
    "int": {"type", "low", "high", "step", "log", "when"},
    "float": {"type", "low", "high", "step", "log", "when"},
    "categorical": {"type", "choices", "ordered", "when"},
    "bool": {"type", "when"},
    "fixed": {"type", "value", "when"},
}
ENUMERATE_LIMIT = 50_000
SAMPLES = 4_000
DIGITS = 10  # float parameters on a step are rounded to this many decimals (0.1 + 0.2 = 0.3)


def encode(value: Any) -> Any:
    """Optuna choices must be scalars: lists and mappings travel as JSON strings."""
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def decode(value: Any) -> Any:
    """Inverse of :func:`encode`; a plain string (``""``, ``"[x"``) stays a string."""
    if isinstance(value, str) and value[:1] in ("[", "{"):
        try:
            out = json.loads(value)
        except ValueError:
            return value
        return out if isinstance(out, (list, dict)) else value
    return value


@dataclass(frozen=True)
class Param:
    """One search dimension (or a fixed value), optionally active only ``when`` holds."""

    name: str
    kind: str
    dist: BaseDistribution | None
    value: Any = None
    when: Expr | None = None
    ordered: bool = False  # a categorical whose choices are listed in an order the model may use

    def active(self, values: dict[str, Any]) -> bool:
        return self.when is None or self.when.holds(values)

    def values(self) -> list[Any] | None:
        """All values of a finite dimension (None for a continuous one)."""
        d = self.dist
        if d is None:
            return [self.value]
        if isinstance(d, CategoricalDistribution):
            return [decode(c) for c in d.choices]
        if isinstance(d, IntDistribution):
            if d.log:
                return list(range(d.low, d.high + 1))
            return list(range(d.low, d.high + 1, d.step))
        if d.step is not None:
            n = int(round((d.high - d.low) / d.step))
            return [round(d.low + i * d.step, DIGITS) for i in range(n + 1)]
        return None

    def sample(self, rng: random.Random) -> Any:
        d = self.dist
        if isinstance(d, IntDistribution):  # no list of a million ints per draw
            if d.log:
                return min(d.high, int(round(math.exp(rng.uniform(math.log(d.low), math.log(d.high))))))
            return rng.randrange(d.low, d.high + 1, d.step)
        vals = self.values()
        if vals is not None:
            return rng.choice(vals)
        if d.log:
            return math.exp(rng.uniform(math.log(d.low), math.log(d.high)))
        return rng.uniform(d.low, d.high)

    def contains(self, value: Any) -> bool:
        d = self.dist
        if d is None:
            return value == self.value
        if isinstance(d, CategoricalDistribution):
            return encode(value) in d.choices
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        vals = self.values()
        if vals is not None and isinstance(d, IntDistribution):
            return value in vals
        return d.low <= value <= d.high


@dataclass(frozen=True)
class Space:
    """A compiled search space: ordered parameters, rules, and the engine they belong to."""

    params: dict[str, Param]
    rules: list[Rule]
    engine: type[Engine]
    settings: dict = field(default_factory=dict)

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """Sample one configuration define-by-run; inactive parameters are left out."""
        values: dict[str, Any] = {}
        for p in self.params.values():
            if not p.active(values):
                continue
            if p.dist is None:
                values[p.name] = p.value
            elif isinstance(p.dist, CategoricalDistribution):
                values[p.name] = decode(trial.suggest_categorical(p.name, p.dist.choices))
            elif isinstance(p.dist, IntDistribution):
                values[p.name] = trial.suggest_int(p.name, p.dist.low, p.dist.high, step=p.dist.step, log=p.dist.log)
            else:
                v = trial.suggest_float(p.name, p.dist.low, p.dist.high, step=p.dist.step, log=p.dist.log)
                values[p.name] = round(v, DIGITS) if p.dist.step is not None else v
        return values

    def restrict(self, params: dict[str, Any]) -> dict[str, Any]:
        """Keep only the parameters active under ``params`` (in declaration order)."""
        out: dict[str, Any] = {}
        for p in self.params.values():
            if p.active(out) and p.name in params:
                out[p.name] = params[p.name]
            elif p.active(out) and p.dist is None:
                out[p.name] = p.value
        return out

    def violations(self, params: dict[str, Any]) -> list[str]:
        """Reasons the configuration cannot run: YAML rules, then the engine's own checks."""
        full = {name: params.get(name) for name in self.params}
        reasons = [r.reason for r in self.rules if r.violated(full)]
        return reasons or self.engine.check(params, self.settings)

    def size(self) -> float:
        """Number of distinct configurations (inf if a dimension is continuous)."""
        n = 1.0
        for p in self.params.values():
            vals = p.values()
            if vals is None:
                return math.inf
            n *= len(vals)
        return n

    def configurations(self, limit: int = ENUMERATE_LIMIT, seed: int = 0):
        """All active configurations when the space is small, else ``SAMPLES`` random ones."""
        if self.size() <= limit:
            dims = [(p.name, p.values()) for p in self.params.values()]
            for combo in itertools.product(*(v for _, v in dims)):
                yield self.restrict(dict(zip((n for n, _ in dims), combo)))
            return
        rng = random.Random(seed)
        for _ in range(SAMPLES):
            yield self.restrict({p.name: p.sample(rng) for p in self.params.values()})

    def grid(self) -> dict[str, list]:
        """The search space for Optuna's GridSampler (finite dimensions only)."""
        out = {}
        for p in self.params.values():
            vals = p.values()
            if vals is None:
                raise ConfigError(f"space.{p.name}", "continuous", "the grid sampler needs a step on float parameters")
            if p.dist is not None:
                out[p.name] = [encode(v) for v in vals]
        return out


def _number(path: str, value: Any, integer: bool) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(path, value, "expected an integer" if integer else "expected a number")
    if integer and not isinstance(value, int):
        raise ConfigError(path, value, "expected an integer")
    return value


def _check_knob(path: str, knob: Knob, value: Any) -> None:
    if not knob.accepts(value):
        raise ConfigError(path, value, f"the engine accepts {knob.allowed()}")


def _compile_when(text: Any, known: list[str], path: str, name: str, names: Any) -> Expr:
    """``when`` may name only parameters declared above this one (define-by-run order)."""
    try:
        return compile_expr(text, known, path)
    except ConfigError as e:
        if e.value not in names:
            raise
        why = "cannot name itself" if e.value == name else f"names {e.value}, declared after {name}"
        raise ConfigError(path, text, f"a 'when' {why}; it may only name parameters declared "
                          "above it, so move them up in space") from None


def compile_param(name: str, spec: Any, knob: Knob, path: str, known: list[str], variants: dict,
                  names: Any = ()) -> Param:
    """Validate one ``space.NAME`` entry against its knob and build the Param."""
    if not isinstance(spec, dict):
        spec = {"type": "fixed", "value": spec}
    kind = spec.get("type")
    if kind not in PARAM_TYPES:
        raise unknown_name(f"{path}.type", kind, PARAM_TYPES, "parameter type")
    for key in spec:
        if key not in _KEYS[kind]:
            raise unknown_name(f"{path}.{key}", key, _KEYS[kind], f"key for {'an' if kind == 'int' else 'a'} {kind} parameter")
    when = _compile_when(spec["when"], known, f"{path}.when", name, names) if "when" in spec else None
    is_model = name == "model" and variants
    if kind in ("int", "float"):
        integer = kind == "int"
        if knob.type == "int" and not integer:
            raise ConfigError(f"{path}.type", kind, f"knob {name} takes integers; use type: int")
        if knob.type not in ("int", "float"):
            raise ConfigError(f"{path}.type", kind, f"knob {name} is a {knob.type}; use categorical or bool")
        for key in ("low", "high"):
            if key not in spec:
                raise ConfigError(f"{path}.{key}", None, f"a {kind} parameter needs low and high")
        low = _number(f"{path}.low", spec["low"], integer)
        high = _number(f"{path}.high", spec["high"], integer)
        if low > high:
            raise ConfigError(f"{path}.low", low, f"must be <= high ({high})")
        step = spec.get("step", 1 if integer else None)
        log = spec.get("log", False)
        if not isinstance(log, bool):
            raise ConfigError(f"{path}.log", log, "expected true or false")
        if step is not None:
            step = _number(f"{path}.step", step, integer)
            if step <= 0:
                raise ConfigError(f"{path}.step", step, "must be > 0")
        if log and low <= 0:
            raise ConfigError(f"{path}.low", low, "a log-scale parameter needs low > 0")
        if log and step not in (None, 1):
            raise ConfigError(f"{path}.step", step, "log scale cannot be combined with a step")
        if step is not None and not log and abs((n := (high - low) / step) - round(n)) > 1e-9:
            fit = low + int(n) * step
            raise ConfigError(f"{path}.high", high, f"(high - low) must be a multiple of step {step:g} "
                              f"so that high is reachable; use high: {fit:g} or {fit + step:g}")
        _check_knob(f"{path}.low", knob, low)
        _check_knob(f"{path}.high", knob, high)
        if integer:
            dist = IntDistribution(low, high, log=log, step=1 if log else step)
        else:
            dist = FloatDistribution(float(low), float(high), log=log, step=None if log else step)
        return Param(name, kind, dist, when=when)
    if kind == "bool":
        if knob.type != "bool":
            raise ConfigError(f"{path}.type", kind, f"knob {name} is a {knob.type}, not a bool")
        return Param(name, kind, CategoricalDistribution([False, True]), when=when)
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{path}.choices", choices, "expected a non-empty list")
        enc = [encode(c) for c in choices]
        if len(set(map(str, enc))) != len(enc):
            raise ConfigError(f"{path}.choices", choices, "choices must be distinct")
        for i, c in enumerate(choices):
            if is_model:
                if c not in variants:
                    raise unknown_name(f"{path}.choices[{i}]", c, variants, "model variant")
            else:
                _check_knob(f"{path}.choices[{i}]", knob, c)
        ordered = spec.get("ordered", False)
        if not isinstance(ordered, bool):
            raise ConfigError(f"{path}.ordered", ordered, "expected true or false")
        return Param(name, kind, CategoricalDistribution(enc), when=when, ordered=ordered)
    if "value" not in spec:
        raise ConfigError(f"{path}.value", None, "a fixed parameter needs value")
    value = spec["value"]
    if is_model:
        if value not in variants:
            raise unknown_name(f"{path}.value", value, variants, "model variant")
    else:
        _check_knob(f"{path}.value", knob, value)
    return Param(name, kind, None, value=value, when=when)


def build_space(engine_kind: str, settings: dict, variants: dict, spec: dict, rules: list) -> Space:
    """Validate a space's parameters (``spec``) and ``rules`` against the engine; build the Space."""
    engine = get_engine_class(engine_kind)
    engine.validate_settings(settings, variants, "engine")
    knobs = engine.knobs_for(settings)
    params: dict[str, Param] = {}
    for name, item in spec.items():
        path = f"space.{name}"
        if name not in knobs:
            raise unknown_name(path, name, knobs, f"knob of engine {engine_kind}")
        params[name] = compile_param(name, item, knobs[name], path, list(params), variants, list(spec))
    compiled = [compile_rule(r, params, f"rules[{i}]") for i, r in enumerate(rules)]
    space = Space(params, compiled, engine, settings)
    _check_rules_satisfiable(space)
    return space


def _check_rules_satisfiable(space: Space) -> None:
    """A rule, a ``when`` or a choice that no configuration of the space allows is an error."""
    configs = list(space.configurations())
    for rule in space.rules:
        applicable = [c for c in configs if rule.when is None or rule.when.holds(c)]
        if applicable and all(rule.violated({n: c.get(n) for n in space.params}) for c in applicable):
            how = "any" if space.size() <= ENUMERATE_LIMIT else f"{len(configs)} sampled"
            raise ConfigError(rule.path, rule.require.text, f"this rule never holds for {how} configurations of the space")
    if space.rules and all(any(r.violated({n: c.get(n) for n in space.params}) for r in space.rules) for c in configs):
        raise ConfigError("rules", [r.require.text for r in space.rules], "no configuration of the space satisfies all rules together")
    _check_reachable(space, configs)


def _check_reachable(space: Space, configs: list[dict[str, Any]]) -> None:
    """Every ``when`` holds somewhere; every choice runs (rules + engine check) somewhere.

    A categorical value that the rules or the engine refuse in every combination (a
    ``gpu_split`` too big for the planned GPUs) is an error at load, not a string of
    infeasible trials; a space too big to enumerate is probed around sampled configurations.
    """
    exact = space.size() <= ENUMERATE_LIMIT
    how = "any configuration" if exact else f"{len(configs)} sampled configurations"
    for p in space.params.values():
        if p.when is not None and not any(p.name in c for c in configs):
            raise ConfigError(f"space.{p.name}.when", p.when.text, f"never holds for {how} of the space")
    finite = [p for p in space.params.values() if p.kind in ("categorical", "bool")]
    if not finite:
        return
    if not exact:  # probe each choice in up to 100 sampled configurations where it is active
        configs = [space.restrict({**c, p.name: v}) for p in finite for v in p.values()
                   for c in [c for c in configs if p.name in c][:100]]
    runs: dict[str, set] = {p.name: set() for p in finite}
    why: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    for c in configs:
        full = {n: c.get(n) for n in space.params}
        reasons = [r.reason for r in space.rules if r.violated(full)]
        reasons += space.engine.check(c, space.settings)
        for p in finite:
            if p.name in c:
                key = json.dumps(encode(c[p.name]))
                if not reasons:
                    runs[p.name].add(key)
                elif key not in runs[p.name]:
                    why[(p.name, key)].update(set(reasons))
    for p in finite:
        if not runs[p.name]:
            continue  # nothing runs at all: reported by the rules check with its rule
        for i, v in enumerate(p.values()):
            key = json.dumps(encode(v))
            if key not in runs[p.name] and why[(p.name, key)]:
                where = f"space.{p.name}" + (f".choices[{i}]" if p.kind == "categorical" else "")
                reason = why[(p.name, key)].most_common(1)[0][0]  # the one that always applies
                scope = "" if exact else " (100 sampled)"
                raise ConfigError(where, v, f"no configuration{scope} with this value can run: {reason}",
                                  "Remove it or relax the rule")


def baseline_params(space: Space, variants: dict) -> dict[str, Any]:
    """The engine's default configuration expressed in the space (trial 0)."""
    defaults = space.engine.default_params(space.settings, variants)
    out: dict[str, Any] = {}
    for p in space.params.values():
        if not p.active(out):
            continue
        if p.name not in defaults:
            raise ConfigError(f"space.{p.name}", None, "the engine declares no default for this knob, so trial 0 (the baseline) cannot be built")
        value = defaults[p.name]
        if p.dist is None:
            out[p.name] = p.value
            continue
        if not p.contains(value):
            raise ConfigError(
                f"space.{p.name}", value,
                "the engine's default must be inside the space so trial 0 measures it; widen the range or add it to choices",
            )
        out[p.name] = value
    return out
