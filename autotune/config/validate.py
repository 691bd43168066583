"""The config against what it configures, before any trial: the space and rules against the
engine's knobs (:func:`compile_space`), enqueued configs, reference, workload vs engine, quality
vs engine, the sampler vs the space, and an engine's own timeout vs the trial's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from autotune.errors import ConfigError
from autotune.errors import unknown_name
from autotune.registry import get_engine_class
from autotune.search.samplers import validate_sampler
from autotune.search.space import build_space

if TYPE_CHECKING:
    from autotune.config.schema import Config
    from autotune.search.space import Space


def compile_space(cfg: Config) -> Space:
    """Validate ``cfg.space`` and ``cfg.rules`` against the engine; build the Space."""
    return build_space(cfg.engine.kind, cfg.engine.settings, cfg.engine.variants, cfg.space, cfg.rules)


def validate_enqueue(space: Space, baseline: dict[str, Any], extra: list[Any]) -> None:
    """Each ``study.enqueue`` entry names space parameters with values inside the space."""
    for i, item in enumerate(extra):
        path = f"study.enqueue[{i}]"
        if not isinstance(item, dict) or not item:
            raise ConfigError(path, item, "expected a mapping of parameter -> value")
        for k, v in item.items():
            if k not in space.params:
                raise unknown_name(f"{path}.{k}", k, space.params, "space parameter")
            if not space.params[k].contains(v):
                raise ConfigError(f"{path}.{k}", v, "value is outside the space")
        full = space.restrict({**baseline, **item})
        for k, v in item.items():
            if k not in full:
                when = space.params[k].when
                raise ConfigError(f"{path}.{k}", v, f"{k} is inactive in this configuration "
                                  f"(its when: {when.text if when else '?'} is false); set what it depends on")
        reasons = space.violations(full)
        if reasons:
            raise ConfigError(path, item, "breaks a rule: " + "; ".join(reasons))


def validate_reference(cfg: Config, space: Space) -> None:
    knobs = space.engine.knobs_for(cfg.engine.settings)
    for k, v in cfg.quality.reference.items():
        path = f"quality.reference.{k}"
        if k not in knobs:
            raise unknown_name(path, k, knobs, f"knob of engine {cfg.engine.kind}")
        if k == "model" and cfg.engine.variants:
            if v not in cfg.engine.variants:
                raise unknown_name(path, v, cfg.engine.variants, "model variant")
        elif not knobs[k].accepts(v):
            raise ConfigError(path, v, f"the engine accepts {knobs[k].allowed()}")


def validate_quality(cfg: Config, space: Space) -> None:
    """Quality needs the engine's full next-token distributions (``Engine.logprobs``)."""
    if cfg.quality.enabled and not space.engine.supports_quality:
        hint = space.engine.quality_hint
        raise ConfigError(
            "quality.enabled", True,
            f"engine {cfg.engine.kind} exposes no full logits, so autotune cannot measure "
            f"perplexity or KLD; set quality.enabled: false{hint}",
        )


def validate_timeouts(cfg: Config) -> None:
    """An engine's own timeout must fire before the trial runner kills the whole trial."""
    engine = get_engine_class(cfg.engine.kind)
    own = engine.own_timeout_s(cfg.engine.settings)
    if isinstance(own, (int, float)) and own >= cfg.study.trial_timeout_s:
        raise ConfigError("engine.settings.timeout_s", own,
                          f"must be below study.trial_timeout_s ({cfg.study.trial_timeout_s:g}) so "
                          f"the {cfg.engine.kind} engine's own timeout fires first and the trial reports why")


def validate_all(cfg: Config, space: Space, baseline: dict[str, Any]) -> None:
    """Everything that can be checked without running a trial."""
    validate_quality(cfg, space)
    validate_timeouts(cfg)
    validate_sampler(cfg.study.sampler, space, cfg.study.search, len(cfg.objectives))
    validate_enqueue(space, baseline, cfg.study.enqueue)
    validate_reference(cfg, space)
    max_conc = space.engine.max_concurrency
    if max_conc is not None and cfg.workload.concurrency > max_conc:
        raise ConfigError("workload.concurrency", cfg.workload.concurrency,
                          f"engine {cfg.engine.kind} serves at most {max_conc} request(s) at a time")
