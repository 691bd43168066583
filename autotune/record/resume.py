"""A resume never ranks incomparable measurements together; ``--fork`` starts over from one.

A study keeps, as a study attribute, the parts of its config that define what a
measurement means (:data:`MEASURES`: engine, model variants' files, workload, quality
reference, objectives, constraints' metrics) and those that only steer the search
(:data:`STEERS`: budget, space, rules, samplers, selection). Resuming it with a config
whose measuring parts differ is refused in one line (exit 2) that lists what changed and
offers ``study.name=NEW`` or ``--fork NEW``; a change of steering parts resumes with a
one-line note.

``--fork NEW`` starts the new study seeded with the old one's compatible configurations:
the measured, successful ones that are valid in the new space are enqueued first (best
first), so the new study re-measures them under the new definition before it explores.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from autotune.errors import ConfigError

if TYPE_CHECKING:
    import optuna

    from autotune.config.schema import Config
    from autotune.search.space import Space

PARTS_ATTR = "config_parts"  # study attribute: config_parts() of the config that last ran it
FORKED_ATTR = "forked_from"


def _variants(cfg: Config) -> dict[str, Any]:
    """The model variants with, for each local file, its size: a re-quantised file differs."""
    out: dict[str, Any] = {}
    for name, spec in (cfg.engine.variants or {}).items():
        spec = dict(spec) if isinstance(spec, dict) else {"value": spec}
        path = spec.get("path")
        if isinstance(path, str) and Path(path).is_file():
            spec["size"] = Path(path).stat().st_size
        out[name] = spec
    return out


MEASURES = ("engine", "model variants", "workload", "quality reference", "objectives",
            "constraint metrics")
STEERS = ("budget", "space", "rules", "sampler", "select", "constraint bounds", "engine settings")


def config_parts(cfg: Config) -> dict[str, Any]:
    """The config split into what defines a measurement and what steers the search (JSON)."""
    raw, st = cfg.raw, cfg.study
    parts = {
        "engine": cfg.engine.kind,
        "model variants": _variants(cfg),
        "workload": raw.get("workload"),
        # quality.reuse saves measurements without changing what one means
        "quality reference": ({k: v for k, v in (raw.get("quality") or {}).items() if k != "reuse"}
                              if cfg.quality.enabled else {"enabled": False}),
        "objectives": [o.metric for o in cfg.objectives],
        "constraint metrics": sorted({c.metric for c in cfg.constraints}),
        "budget": {"n_trials": st.n_trials, "timeout_s": st.timeout_s},
        "space": raw.get("space"),
        "rules": raw.get("rules"),
        "sampler": {"sampler": st.sampler, "seed": st.seed, "n_startup": st.n_startup},
        "select": raw.get("select"),
        "constraint bounds": [str(c) for c in cfg.constraints],
        "engine settings": (raw.get("engine") or {}).get("settings"),
    }
    return json.loads(json.dumps(parts, sort_keys=True, default=str))


def _leaf_diffs(old: Any, new: Any, prefix: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += _leaf_diffs(old.get(k), new.get(k), f"{prefix}.{k}")
        return out
    return [] if old == new else [f"{prefix} {_short(old)} -> {_short(new)}"]


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def changes(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(measuring parts that changed with their first differing keys, steering parts that changed)."""
    measured = []
    for part in MEASURES:
        if part in old and old[part] != new.get(part):
            diffs = _leaf_diffs(old[part], new.get(part), part.split()[0])
            measured.append(part + (f" ({'; '.join(diffs[:2])})" if diffs else ""))
    steered = [part for part in STEERS if part in old and old[part] != new.get(part)]
    return measured, steered


def check_resume(cfg: Config, study: optuna.Study | None, fork_hint: bool = True) -> str:
    """Raise a one-line ConfigError if resuming ``study`` with ``cfg`` mixes measurements.

    Returns a one-line note ('' if nothing to say) for a resume that stays comparable.
    """
    if study is None or not study.trials:
        return ""
    from autotune.record.optuna_study import study_attr

    old = study_attr(study, PARTS_ATTR)
    if not old:
        return ("resuming a study started before autotune recorded its config parts: "
                "not checked for changes")
    measured, steered = changes(old, config_parts(cfg))
    if measured:
        name = cfg.study.name
        raise ConfigError(
            "study.name", name,
            f"this study was measured with another {', '.join(measured)}; old and new results "
            f"would be ranked together. Run a new study (study.name={name}-2) or fork this one "
            f"(--fork {name}-2: a new study seeded with its compatible configurations)")
    if steered:
        return f"resuming with a changed {', '.join(steered)}: measurements stay comparable"
    return ""


def existing_study(cfg: Config) -> optuna.Study | None:
    """The study of ``cfg`` if its storage already holds it (read-only in spirit), else None."""
    import optuna

    from autotune.record.storage import sqlite_path

    path = sqlite_path(cfg.storage_url)
    if path is not None and not path.exists():
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=cfg.study.name, storage=cfg.storage_url)
    except KeyError:
        return None


def fork_seeds(source: optuna.Study, cfg: Config, space: Space, baseline: dict[str, Any]) -> list[dict]:
    """The source's measured, successful configurations valid in ``space``, best first."""
    from autotune.objectives import get_metric
    from autotune.record.optuna_study import LAUNCHED
    from autotune.record.optuna_study import records

    metric = cfg.select.metric
    higher = get_metric(metric).higher_is_better
    ok = [r for r in records(source) if r.kind == LAUNCHED and r.status == "ok"]

    def key(r) -> tuple[int, float]:
        v = r.metrics.get(metric, math.nan)
        return (0, -v if higher else v) if math.isfinite(v) else (1, r.number)

    seeds, seen = [], set()
    for r in sorted(ok, key=key):
        params = space.restrict({**baseline, **r.params})
        text = json.dumps(params, sort_keys=True, default=str)
        if text in seen or params == baseline or space.violations(params):
            continue
        if not all(space.params[k].contains(v) for k, v in params.items() if k in space.params):
            continue
        seen.add(text)
        seeds.append(params)
    return seeds[:max(1, cfg.study.n_trials // 2)]


def fork_overrides(source: Config, name: str) -> list[str]:
    """The overrides that turn ``source``'s config into that of its fork ``name``."""
    if not name or "/" in name or name == source.study.name:
        raise ConfigError("--fork", name, f"expected a new study name (not {source.study.name!r}, no '/')")
    return [f"study.name={name}", f"study.dir={Path(source.study.dir).parent / name}"]


def before_run(cfg: Config, space: Space, baseline: dict[str, Any],
               source: Config | None = None) -> tuple[list[str], list[dict]]:
    """Checks before ``autotune run`` writes anything: (notes, configurations to enqueue first).

    The storage must be readable (:func:`~autotune.record.storage.check_db`); a resume must
    keep measurements comparable (:func:`check_resume`); a fork (``source``) must name a new
    study and gets the source's compatible configurations as seeds (:func:`fork_seeds`).
    """
    from autotune.record.storage import check_db

    check_db(Path(cfg.study.dir), cfg.storage_url, for_run=True)
    study = existing_study(cfg)
    if source is None:
        return [n for n in (check_resume(cfg, study),) if n], []
    if study is not None and study.trials:
        raise ConfigError("--fork", cfg.study.name, "a study of that name exists already; choose another name")
    check_db(Path(source.study.dir), source.storage_url)
    old = existing_study(source)
    if old is None or not old.trials:
        raise ConfigError("--fork", cfg.study.name, f"study {source.study.name!r} has no trials to fork from")
    seeds = fork_seeds(old, cfg, space, baseline)
    return [f"forked from study {source.study.name}: {len(seeds)} of its configurations are "
            "measured first"], seeds
