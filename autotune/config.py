"""Config schemas (dataclasses) and their validation from a composed Hydra config.

``load_config(cfg)`` turns the plain dict that Hydra composed into frozen dataclasses.
Every error is a :class:`~autotune.errors.ConfigError` carrying the config path (such
as ``study.n_trials``), the value received and what is allowed. Engine-specific checks
(knob names, variants, rules) happen in :mod:`autotune.space`.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import types
import typing
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from autotune.errors import ConfigError
from autotune.errors import unknown_name

SAMPLERS = ("tpe", "gp", "nsga2", "random", "grid")
SELECT_RULES = ("max", "knee", "weighted")


@dataclass(frozen=True)
class StudyConfig:
    """Where a study lives and how long it runs."""

    name: str = "autotune"
    dir: str = "studies/autotune"
    storage: str | None = None  # default: sqlite:///<dir>/optuna.db
    n_trials: int = 12
    timeout_s: float | None = None
    seed: int | None = 0
    sampler: str = "tpe"
    trial_timeout_s: float = 300.0
    enqueue: list[dict] = field(default_factory=list)
    objectives_modules: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class EngineConfig:
    """Which engine, its fixed settings, and its model variants."""

    kind: str = "llamacpp"
    settings: dict = field(default_factory=dict)
    variants: dict = field(default_factory=dict)
    export: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class WorkloadConfig:
    """What each trial runs: a named prompt set, output length, warm-up and repeats."""

    name: str = "short"
    prompts: str = "short"
    max_tokens: int = 64
    warmup: int = 1
    repeats: int = 5
    concurrency: int = 1
    ignore_eos: bool = True


@dataclass(frozen=True)
class QualityConfig:
    """Quality vs a reference configuration, measured once per study and cached."""

    enabled: bool = True
    text: str = "gpl3"
    n_tokens: int = 512
    reference: dict = field(default_factory=dict)
    kld: bool = True


@dataclass(frozen=True)
class RayConfig:
    """Ray placement: local embedded by default; ``address`` joins a cluster."""

    address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    max_concurrent: int | None = None
    resources: dict = field(default_factory=dict)
    runtime_env: dict = field(default_factory=dict)
    wait_timeout_s: float = 5.0


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow store (SQLite under mlruns/ by default)."""

    enabled: bool = True
    uri: str = "sqlite:///mlruns/mlflow.db"
    artifacts: str = "mlruns/artifacts"
    experiment: str | None = None


@dataclass(frozen=True)
class SelectConfig:
    """How the winner is chosen among feasible Pareto trials, and how noise is handled."""

    rule: str = "max"
    metric: str = "decode_tps"
    weights: dict = field(default_factory=dict)
    top_k: int = 3
    rerun_repeats: int = 3


@dataclass(frozen=True)
class Objective:
    metric: str
    direction: str


@dataclass(frozen=True)
class Constraint:
    """``metric op bound``; Optuna's convention: value <= 0 is feasible."""

    metric: str
    op: str
    bound: float

    def violation(self, value: float) -> float:
        """Signed violation in the metric's unit (<= 0 is feasible)."""
        return value - self.bound if self.op == "<=" else self.bound - value

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.bound:g}"


@dataclass(frozen=True)
class Config:
    """The whole resolved configuration of a study."""

    study: StudyConfig
    engine: EngineConfig
    space: dict
    rules: list
    objectives: list[Objective]
    constraints: list[Constraint]
    workload: WorkloadConfig
    quality: QualityConfig
    ray: RayConfig
    tracking: TrackingConfig
    select: SelectConfig
    raw: dict = field(repr=False, default_factory=dict)

    @property
    def storage_url(self) -> str:
        return self.study.storage or f"sqlite:///{self.study.dir}/optuna.db"


_SECTIONS = {
    "study": StudyConfig,
    "engine": EngineConfig,
    "workload": WorkloadConfig,
    "quality": QualityConfig,
    "ray": RayConfig,
    "tracking": TrackingConfig,
    "select": SelectConfig,
}
_TOP_KEYS = set(_SECTIONS) | {"space", "rules", "objectives", "constraints"}
_CONSTRAINT_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=)\s*([-+0-9.eE]+)\s*$")


def _check_type(path: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against a simple annotation; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check_type(path, value, inner[0])
    if origin is list or tp is list:
        if not isinstance(value, list):
            raise ConfigError(path, value, "expected a list")
        return value
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, value, "expected a mapping")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, value, "expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, value, "expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, value, "expected a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, value, "expected a string")
        return value
    return value


def build_section(cls: type, data: Any, path: str):
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types raise ConfigError."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path, data, "expected a mapping")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise unknown_name(f"{path}.{key}", key, names, "key")
    kwargs = {k: _check_type(f"{path}.{k}", v, hints[k]) for k, v in data.items()}
    return cls(**kwargs)


def _positive(path: str, value: float | int | None, allow_zero: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(path, value, "must be > 0" if not allow_zero else "must be >= 0")


def parse_constraint(text: Any, path: str) -> Constraint:
    """Parse ``"ttft_p95_ms <= 200"``; the metric must be registered."""
    from objectives import get_metric

    if isinstance(text, dict) and {"metric", "op", "bound"} <= set(text):
        text = f"{text['metric']} {text['op']} {text['bound']}"
    m = _CONSTRAINT_RE.match(str(text)) if isinstance(text, str) else None
    if not m:
        raise ConfigError(path, text, "expected 'METRIC <= NUMBER' or 'METRIC >= NUMBER'")
    get_metric(m.group(1), path)
    return Constraint(m.group(1), m.group(2), float(m.group(3)))


def parse_objective(item: Any, path: str) -> Objective:
    """An objective is a metric name (direction from the registry) or {metric, direction}."""
    from objectives import get_metric

    if isinstance(item, str):
        return Objective(item, get_metric(item, path).direction)
    if isinstance(item, dict) and "metric" in item:
        metric = get_metric(item["metric"], f"{path}.metric")
        direction = item.get("direction", metric.direction)
        if direction != metric.direction:
            raise ConfigError(
                f"{path}.direction", direction,
                f"metric {metric.name} is registered as {metric.direction}; "
                "register another metric to optimise the other way",
            )
        extra = set(item) - {"metric", "direction"}
        if extra:
            raise unknown_name(f"{path}.{sorted(extra)[0]}", sorted(extra)[0], ["metric", "direction"], "key")
        return Objective(metric.name, direction)
    raise ConfigError(path, item, "expected a metric name or {metric: NAME}")


def _absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def _is_file_ref(value: str) -> bool:
    return "/" in value or value.endswith((".jsonl", ".txt"))


def resolve_paths(data: dict) -> dict:
    """Make relative file paths absolute against the directory ``autotune run`` was started in.

    Trials run in other working directories (and on other Ray nodes), so a variant's
    ``path``, a prompt-set file and a quality text file are pinned here, once.
    """
    data = copy.deepcopy(data)
    variants = (data.get("engine") or {}).get("variants") or {}
    for v in variants.values():
        if isinstance(v, dict) and isinstance(v.get("path"), str):
            v["path"] = _absolute(v["path"])
    for section, key in (("workload", "prompts"), ("quality", "text")):
        sec = data.get(section)
        if isinstance(sec, dict) and isinstance(sec.get(key), str) and _is_file_ref(sec[key]):
            sec[key] = _absolute(sec[key])
    return data


def load_config(data: dict) -> Config:
    """Validate a composed config (a plain dict) into a :class:`Config`."""
    import importlib

    if not isinstance(data, dict):
        raise ConfigError("<root>", data, "expected a mapping")
    data = resolve_paths(data)
    for key in data:
        if key not in _TOP_KEYS and key != "hydra":
            raise unknown_name(key, key, _TOP_KEYS, "top-level key")
    sections = {name: build_section(cls, data.get(name), name) for name, cls in _SECTIONS.items()}
    study: StudyConfig = sections["study"]
    for i, mod in enumerate(study.objectives_modules):
        try:
            importlib.import_module(mod)
        except ImportError as e:
            raise ConfigError(f"study.objectives_modules[{i}]", mod, f"cannot import: {e}") from e
    _positive("study.n_trials", study.n_trials)
    _positive("study.timeout_s", study.timeout_s)
    _positive("study.trial_timeout_s", study.trial_timeout_s)
    if study.sampler not in SAMPLERS:
        raise unknown_name("study.sampler", study.sampler, SAMPLERS, "sampler")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", study.name):
        raise ConfigError("study.name", study.name, "use letters, digits, '_', '-' and '.' only")
    wl: WorkloadConfig = sections["workload"]
    for key in ("max_tokens", "repeats", "concurrency"):
        _positive(f"workload.{key}", getattr(wl, key))
    if wl.max_tokens < 2:
        raise ConfigError("workload.max_tokens", wl.max_tokens, "must be >= 2 (decode speed needs 2 tokens)")
    _positive("workload.warmup", wl.warmup, allow_zero=True)
    q: QualityConfig = sections["quality"]
    if q.n_tokens < 16:
        raise ConfigError("quality.n_tokens", q.n_tokens, "must be >= 16")
    sel: SelectConfig = sections["select"]
    if sel.rule not in SELECT_RULES:
        raise unknown_name("select.rule", sel.rule, SELECT_RULES, "rule")
    _positive("select.top_k", sel.top_k, allow_zero=True)
    rc: RayConfig = sections["ray"]
    _positive("ray.max_concurrent", rc.max_concurrent)

    objectives_raw = data.get("objectives") or []
    if not isinstance(objectives_raw, list) or not objectives_raw:
        raise ConfigError("objectives", objectives_raw, "expected a non-empty list of metric names")
    objectives = [parse_objective(o, f"objectives[{i}]") for i, o in enumerate(objectives_raw)]
    names = [o.metric for o in objectives]
    if len(set(names)) != len(names):
        raise ConfigError("objectives", names, "each metric may appear once")
    constraints_raw = data.get("constraints") or []
    if not isinstance(constraints_raw, list):
        raise ConfigError("constraints", constraints_raw, "expected a list like ['ttft_p95_ms <= 200']")
    constraints = [parse_constraint(c, f"constraints[{i}]") for i, c in enumerate(constraints_raw)]
    from objectives import get_metric

    get_metric(sel.metric, "select.metric")
    for k in sel.weights:
        get_metric(k, f"select.weights.{k}")
    space = data.get("space") or {}
    if not isinstance(space, dict) or not space:
        raise ConfigError("space", space, "expected a non-empty mapping of parameter name -> spec")
    rules = data.get("rules") or []
    if not isinstance(rules, list):
        raise ConfigError("rules", rules, "expected a list of rule expressions")
    return Config(
        objectives=objectives, constraints=constraints, space=space, rules=rules, raw=data, **sections
    )
