"""Config schemas (dataclasses) and their validation from a composed Hydra config.

``load_config(cfg)`` turns the plain dict that Hydra composed into frozen dataclasses.
Every error is a :class:`~autotune.errors.ConfigError` carrying the config path (such
as ``study.n_trials``), the value received and what is allowed. Engine-specific checks
(knob names, variants, rules) happen in :mod:`autotune.search.space`.
"""

from __future__ import annotations

import copy
import math
import os
import re
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from autotune._sections import build_section
from autotune.config import checks
from autotune.errors import ConfigError
from autotune.errors import unknown_name
from autotune.measure.spec import ARRIVALS
from autotune.measure.spec import LOADS
from autotune.measure.spec import WorkloadSpec
from autotune.objectives.goals import Constraint
from autotune.objectives.goals import Objective

SAMPLERS = ("auto", "bo", "tpe", "gp", "nsga2", "random", "grid")
SEARCH_MODES = ("single", "pareto")
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
    sampler: str = "auto"
    search: str = "single"  # single: optimise what select picks the winner by; pareto: objectives
    n_startup: int | None = None  # space-filling startup trials incl. trial 0 (None: from n_trials)
    precheck: bool = True  # skip configurations the engine predicts will not fit
    early_stop: bool = True  # stop a search trial as soon as it cannot win (PRUNED; issue 43)
    max_rejected: int | None = None  # proposals refused in a row before the study stops (20 x n_trials)
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


# The workload section is the record a trial carries (no second copy of its defaults).
WorkloadConfig = WorkloadSpec


@dataclass(frozen=True)
class QualityConfig:
    """Quality vs a reference configuration, measured once per study and cached."""

    enabled: bool = True
    text: str = "gpl3"
    n_tokens: int = 512
    reference: dict = field(default_factory=dict)
    kld: bool = True
    reuse: bool = True  # a trial whose quality knobs were measured reuses those numbers


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
class ReportConfig:
    """The report written at the end of ``autotune run`` (``autotune report`` writes it anytime)."""

    enabled: bool = True   # report.html, logged to the MLflow parent run
    png: bool = True       # PNG images of the plots (kaleido + a headless Chromium)


@dataclass(frozen=True)
class SelectConfig:
    """How the winner is chosen among feasible Pareto trials, and how noise is handled."""

    rule: str = "max"
    metric: str = "decode_tps"
    weights: dict = field(default_factory=dict)
    top_k: int = 3
    rerun_repeats: int = 3


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
    report: ReportConfig = field(default_factory=ReportConfig)
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
    "report": ReportConfig,
}
_TOP_KEYS = set(_SECTIONS) | {"space", "rules", "objectives", "constraints"}
_CONSTRAINT_RE = re.compile(
    r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=)\s*([-+0-9.eE]+)\s*(?:(?:x|\*)\s*(baseline))?\s*$")


def _positive(path: str, value: float | int | None, allow_zero: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(path, value, "must be > 0" if not allow_zero else "must be >= 0")


def validate_workload(wl: WorkloadSpec, trial_timeout_s: float | None = None) -> None:
    """Range and combination checks of the ``workload`` section (ConfigError with its path)."""
    for key in ("max_tokens", "repeats", "concurrency", "turns", "max_concurrency", "max_rate",
                "search_time_s", "rate"):
        _positive(f"workload.{key}", getattr(wl, key))
    if wl.max_tokens < 2:
        raise ConfigError("workload.max_tokens", wl.max_tokens, "must be >= 2 (decode speed needs 2 tokens)")
    _positive("workload.warmup", wl.warmup, allow_zero=True)
    _positive("workload.saturation_gain", wl.saturation_gain, allow_zero=True)
    if wl.arrival not in ARRIVALS:
        raise unknown_name("workload.arrival", wl.arrival, ARRIVALS, "arrival")
    if wl.load not in LOADS:
        raise unknown_name("workload.load", wl.load, LOADS, "load")
    if wl.arrival == "poisson" and wl.rate is None:
        raise ConfigError("workload.rate", None, "arrival: poisson needs a rate in requests/s (> 0)")
    shapes = [k for k, on in (("turns", wl.turns > 1), ("mix", bool(wl.mix)),
                              ("context_ladder", bool(wl.context_ladder))) if on]
    if len(shapes) > 1:
        raise ConfigError(f"workload.{shapes[1]}", getattr(wl, shapes[1]),
                          f"cannot be combined with workload.{shapes[0]}; use one workload shape")
    for i, m in enumerate(wl.mix):
        _positive(f"workload.mix[{i}].prompt_tokens", m.prompt_tokens)
        _positive(f"workload.mix[{i}].weight", m.weight)
        if m.output_tokens < 2:
            raise ConfigError(f"workload.mix[{i}].output_tokens", m.output_tokens, "must be >= 2")
    for i, n in enumerate(wl.context_ladder):
        _positive(f"workload.context_ladder[{i}]", n)
    if list(wl.context_ladder) != sorted(wl.context_ladder):
        raise ConfigError("workload.context_ladder", list(wl.context_ladder), "list lengths in increasing order")
    slo = wl.slo
    for key in ("ttft_p95_ms", "itl_p95_ms", "e2e_p99_ms"):
        _positive(f"workload.slo.{key}", getattr(slo, key))
    if not 0.0 <= slo.error_rate <= 1.0:
        raise ConfigError("workload.slo.error_rate", slo.error_rate, "must be in [0, 1] (a share of requests)")
    if wl.load == "slo":
        if slo.ttft_p95_ms is None and slo.itl_p95_ms is None and slo.e2e_p99_ms is None:
            raise ConfigError("workload.slo", asdict(slo),
                              "load: slo needs at least one of ttft_p95_ms, itl_p95_ms, e2e_p99_ms")
        if wl.context_ladder:
            raise ConfigError("workload.load", wl.load, "load: slo cannot search a context_ladder; use fixed")
        if trial_timeout_s is not None and wl.search_time_s >= trial_timeout_s:
            raise ConfigError("workload.search_time_s", wl.search_time_s,
                              f"must be below study.trial_timeout_s ({trial_timeout_s:g}), which also "
                              "covers the engine's start and warm-up; lower it or raise the timeout")


def parse_constraint(text: Any, path: str) -> Constraint:
    """Parse ``"ttft_p95_ms <= 200"`` or, relative to the baseline's measurement (trial 0, the
    engine's defaults), ``"ttft_p95_ms <= 1.5x baseline"``; the metric must be registered."""
    from autotune.objectives import get_metric

    if isinstance(text, dict) and {"metric", "op", "bound"} <= set(text):
        text = f"{text['metric']} {text['op']} {text['bound']}"
    m = _CONSTRAINT_RE.match(str(text)) if isinstance(text, str) else None
    try:
        number = float(m.group(3)) if m else math.nan
    except ValueError:
        number = math.nan
    if not m or not math.isfinite(number):
        raise ConfigError(path, text, "expected 'METRIC <= NUMBER', 'METRIC >= NUMBER' or, relative "
                          "to the engine defaults' measurement, 'METRIC <= NUMBERx baseline'")
    get_metric(m.group(1), path)
    if m.group(4) is None:
        return Constraint(m.group(1), m.group(2), number)
    if number <= 0:
        raise ConfigError(path, text, "a relative bound needs a factor > 0 (e.g. 1.5x baseline)")
    return Constraint(m.group(1), m.group(2), math.nan, factor=number)


def parse_objective(item: Any, path: str) -> Objective:
    """An objective is a metric name (direction from the registry) or {metric, direction}."""
    from autotune.objectives import get_metric

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
    if study.search not in SEARCH_MODES:
        raise unknown_name("study.search", study.search, SEARCH_MODES, "search mode")
    _positive("study.n_startup", study.n_startup, allow_zero=True)
    _positive("study.max_rejected", study.max_rejected)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", study.name):
        raise ConfigError("study.name", study.name, "use letters, digits, '_', '-' and '.' only")
    validate_workload(sections["workload"], study.trial_timeout_s)
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
    _check_satisfiable(constraints, constraints_raw)
    _check_expected(sections["engine"].settings, constraints)
    from autotune.objectives import get_metric

    get_metric(sel.metric, "select.metric")
    for k in sel.weights:
        get_metric(k, f"select.weights.{k}")
    space = data.get("space") or {}
    if not isinstance(space, dict) or not space:
        raise ConfigError("space", space, "expected a non-empty mapping of parameter name -> spec")
    rules = data.get("rules") or []
    if not isinstance(rules, list):
        raise ConfigError("rules", rules, "expected a list of rule expressions")
    rules = _check_pointers(data, sections, rules)
    return Config(
        objectives=objectives, constraints=constraints, space=space, rules=rules, raw=data, **sections
    )


def _check_expected(settings: Any, constraints: list[Constraint]) -> None:
    """``engine.settings.predict.expect`` names constrained metrics: an expectation of anything
    else (a typo, an objective) would be read by nothing."""
    predict = settings.get("predict") if isinstance(settings, dict) else None
    expect = predict.get("expect") if isinstance(predict, dict) else None
    constrained = sorted({c.metric for c in constraints})
    for metric in expect if isinstance(expect, dict) else ():
        if metric not in constrained:
            raise ConfigError(f"engine.settings.predict.expect.{metric}", metric,
                              f"a constrained metric ({', '.join(constrained) or 'the study has no constraints'})")


def _check_pointers(data: dict, sections: dict, rules: list) -> list:
    """What the config points at (see :mod:`autotune.config.checks`); returns the rules to use.

    The rules gain one automatic rule when some context sizes of the space are too small
    for the workload (``cfg.raw`` keeps the user's rules as written).
    """
    study, tracking, quality = sections["study"], sections["tracking"], sections["quality"]
    checks.validate_storage(study.dir, study.storage)
    if tracking.enabled:
        checks.validate_tracking(tracking.uri, tracking.artifacts)
    checks.validate_quality_text(quality.enabled, quality.text)
    prompts = checks.prompt_reasons(sections["workload"].prompts)
    extra = checks.context_rule(data, sections["workload"], prompts)
    return [*rules, extra] if extra else rules


def _check_satisfiable(constraints: list[Constraint], raw: list) -> None:
    """No metric may be bounded above below where it is bounded below (absolute bounds, and
    relative ones against each other: their baseline is one value)."""
    for metric in {c.metric for c in constraints}:
        for absolute in (True, False):
            same = [c for c in constraints if c.metric == metric and (c.factor is None) == absolute]
            at = (lambda c: c.bound) if absolute else (lambda c: c.factor)
            upper = min((at(c) for c in same if c.op == "<="), default=None)
            lower = max((at(c) for c in same if c.op == ">="), default=None)
            if upper is not None and lower is not None and lower > upper:
                unit = "" if absolute else "x baseline"
                raise ConfigError("constraints", raw, f"no value of {metric} is both >= {lower:g}{unit} "
                                  f"and <= {upper:g}{unit}; relax one bound")
