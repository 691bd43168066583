"""Studies on disk: find them, read their config, Optuna trials and summary, tell their state.

A study directory (``studies/<name>/``) holds ``optuna.db`` (the truth), ``config.yaml``
(the resolved config, written by ``autotune run`` once it is validated), ``summary.json``
and the exports once the study ends, and ``.running`` (the driver's pid) while it runs.
The ``report``, ``export``, ``ui`` and ``ls`` commands read studies through this module
only, as records: the config as a :class:`~autotune.config.schema.Config`, the summary as a
:class:`~autotune.record.summary.StudySummary`, the trials as
:class:`~autotune.search.trials.Record`. Nothing here writes into a study.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from autotune.errors import ConfigError
from autotune.errors import did_you_mean
from autotune.record.summary import StudySummary

if TYPE_CHECKING:
    import optuna

    from autotune.config.schema import Config
    from autotune.search.trials import Record

RUNNING_FILE = ".running"
CONFIG_FILE = "config.yaml"


def study_dirs(root: Path = Path("studies")) -> list[Path]:
    """Every study directory under ``root`` (one with an ``optuna.db`` or a ``config.yaml``,
    so a study whose database was lost is still listed and can be repaired), newest first."""
    if not root.is_dir():
        return []
    found = {p.parent for name in ("optuna.db", CONFIG_FILE) for p in root.glob(f"*/{name}")}

    def mtime(d: Path) -> float:
        return max(f.stat().st_mtime for f in (d / "optuna.db", d / CONFIG_FILE) if f.exists())

    return sorted(found, key=mtime, reverse=True)


def find_study(arg: str | None, root: Path = Path("studies")) -> Path:
    """The study directory named on the command line, or the newest one under ``root``."""
    if arg is None:
        found = study_dirs(root)
        if not found:
            raise ConfigError("STUDY_DIR", str(root), "no study found (a directory with optuna.db); "
                              "run `autotune run` first or name a study directory")
        return found[0]
    path = Path(arg)
    if not path.is_dir() and (root / arg).is_dir():
        path = root / arg
    if not path.is_dir():
        names = [p.name for p in study_dirs(root)]
        raise ConfigError("STUDY_DIR", arg, "not a directory; studies here: " + (", ".join(names) or "none"),
                          did_you_mean(arg, names))
    if not (path / "optuna.db").exists() and not (path / CONFIG_FILE).exists():
        raise ConfigError("STUDY_DIR", arg, "not a study directory (no optuna.db or config.yaml in it)")
    return path


def read_config(path: Path) -> Config:
    """The study's resolved config: ``config.yaml``, else ``best.yaml`` (older studies).

    ``study.dir`` is set to ``path``; the dict as written is ``Config.raw``.
    """
    from autotune.config.schema import load_config

    for name in (CONFIG_FILE, "best.yaml"):
        f = path / name
        if f.exists():
            data = yaml.safe_load(f.read_text())
            if name == "best.yaml":  # best.yaml renames the study; the storage is this one's
                data["study"]["name"] = data["study"]["name"].removesuffix("-best")
            data["study"]["dir"] = str(path)
            return load_config(data)
    raise ConfigError("STUDY_DIR", str(path), "has no config.yaml (or best.yaml): it was started by an "
                      "older autotune; run `autotune run` with the same preset once to write it")


def constraints_as_written(config: Config) -> list[str]:
    """The study's constraints as its config spells them (``ppl_delta_pct <= 2.0``), for reports."""
    return [str(c) for c in config.raw.get("constraints") or []]


def storage_url(path: Path, config: Config) -> str:
    """Where the study's trials are: the configured storage or ``<dir>/optuna.db``."""
    return config.study.storage or f"sqlite:///{path.resolve()}/optuna.db"


def load_study(path: Path, config: Config) -> optuna.Study:
    """The Optuna study of a study directory, opened read-only in spirit (no trial is added)."""
    import optuna

    from autotune.record.storage import check_db

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = storage_url(path, config)
    check_db(path, url)  # one line (unreadable, truncated, missing) instead of a SQLAlchemy traceback
    try:
        return optuna.load_study(study_name=config.study.name, storage=url)
    except KeyError as e:
        raise ConfigError("STUDY_DIR", str(path), f"no Optuna study {config.study.name!r} in {url}") from e


def read_summary(path: Path) -> StudySummary | None:
    """``summary.json`` as a :class:`StudySummary` (None if the study has not ended yet)."""
    f = path / "summary.json"
    return StudySummary.load(f) if f.exists() else None


def running_pid(path: Path) -> int | None:
    """The pid of the ``autotune run`` driving this study, if it is alive."""
    f = path / RUNNING_FILE
    try:
        pid = int(f.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists() and b"autotune" not in cmdline.read_bytes():
        return None  # the pid was reused by another program
    return pid


@dataclass(frozen=True)
class StudyState:
    """One line of ``autotune ls``."""

    name: str
    path: Path
    done: int
    total: int | None
    feasible: int
    best: float | None
    best_trial: int | None
    metric: str
    speedup: float | None
    state: str  # running | finished | interrupted | stopped


def best_feasible(records: list[Record], metric: str) -> Record | None:
    """The feasible record with the best value of ``metric`` (None if none)."""
    from autotune.objectives import get_metric

    m = get_metric(metric)
    best = None
    for r in records:
        v = r.metrics.get(metric)
        if r.feasible and v is not None and math.isfinite(v) and (best is None or m.better(v, best.metrics[metric])):
            best = r
    return best


def state_of(path: Path) -> StudyState:
    """Progress, best so far and whether the study runs, from its files."""
    from autotune.objectives import get_metric
    from autotune.record.optuna_study import records

    config = read_config(path)
    metric = config.select.metric
    study = load_study(path, config)
    recs = records(study)
    best = best_feasible(recs, metric)
    base = next((r for r in recs if r.number == 0), None)
    summary = read_summary(path)
    if running_pid(path):
        state = "running"
    elif summary is None:
        state = "stopped"
    else:
        state = "interrupted" if summary.interrupted else "finished"
    value = best.metrics[metric] if best else None
    return StudyState(
        name=config.study.name, path=path, done=len(recs), total=config.study.n_trials,
        feasible=sum(r.feasible for r in recs), best=value, best_trial=best.number if best else None,
        metric=metric, speedup=get_metric(metric).speedup(value, base.metrics.get(metric) if base else None),
        state=state,
    )
