"""``autotune repair STUDY``: rebuild a damaged ``optuna.db`` and the MLflow runs from what is left.

The damaged file is kept beside the new one (``optuna.db.corrupt-<UTC time>``, with its
``-wal``/``-shm``). Trial by trial, in number order, the rebuilt study takes:

1. the trial as ``optuna.db.bak`` holds it, when it had finished there (the online backup
   the driver writes after each told trial: parameters, values, constraints and user
   attributes exactly as told);
2. otherwise, from ``trials/NNNN/``: ``spec.json`` + ``result.json`` are told again through
   :func:`autotune.record.optuna_study.tell`, the driver's own path (parameters, metrics, status,
   constraints; the node and duration come from the files, the value told for a failure is
   the worst seen in the rebuilt order); a trial with a spec and no result was cut off and
   is marked interrupted, so the next ``autotune run`` measures it again;
3. otherwise a trial the backup held waiting or running, as it was (waiting) or interrupted;
4. otherwise a ``lost`` placeholder (FAIL, counted nowhere) that keeps the numbers aligned
   with ``trials/`` and MLflow: a proposal told after the last backup and never launched.

MLflow is then made equal to Optuna: runs of trials the study no longer has are deleted,
missing ones logged (:meth:`autotune.record.tracking.Tracker.reconcile`). The study's own
attributes (MLflow parent run, config parts) come from the backup or are recomputed.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from autotune.errors import ConfigError
from autotune.record.mlflow_view import PARENT_ATTR
from autotune.record.resume import FORKED_ATTR
from autotune.record.resume import PARTS_ATTR

if TYPE_CHECKING:
    import optuna

    from autotune.config.schema import Config
    from autotune.search.space import Space

LOST = "lost"
STUDY_ATTRS = (PARENT_ATTR, PARTS_ATTR, "fingerprint", FORKED_ATTR)  # the study's own, from the backup


def add_parser(sub) -> None:
    """Add ``autotune repair`` to the CLI."""
    rep = sub.add_parser("repair", help="rebuild a damaged optuna.db and the MLflow runs from trials/",
                         description=__doc__.split("\n\n")[0])
    rep.add_argument("study_dir", help="the study directory (or a name under studies/)")
    rep.add_argument("--force", action="store_true", help="rebuild even if optuna.db reads fine")
    rep.set_defaults(func=cmd_repair)


def cmd_repair(args: argparse.Namespace) -> int:
    """Rebuild the study; print what was rebuilt from where."""
    from autotune.record.lock import StudyLock

    path = Path(args.study_dir)
    if not path.is_dir() and (Path("studies") / args.study_dir).is_dir():
        path = Path("studies") / args.study_dir
    if not path.is_dir():
        raise ConfigError("STUDY_DIR", args.study_dir, "not a directory")
    with StudyLock(path):  # never under a running driver
        for line in repair(path, force=args.force):
            print(line)
    return 0


def _load_backup(bak: Path, name: str) -> tuple[dict[int, Any], dict[str, Any]]:
    """(trials by number, study attributes) of a readable backup; empty if none."""
    import optuna

    from autotune.record.optuna_study import study_attr
    from autotune.record.storage import db_problem

    if not bak.exists() or db_problem(bak):
        return {}, {}
    with tempfile.TemporaryDirectory() as tmp:  # read a copy: never write beside the backup
        copy = Path(tmp) / "backup.db"
        shutil.copyfile(bak, copy)
        try:
            study = optuna.load_study(study_name=name, storage=f"sqlite:///{copy}")
        except KeyError:
            return {}, {}
        return {t.number: t for t in study.get_trials()}, {k: study_attr(study, k) for k in STUDY_ATTRS}


def _set_aside(db: Path) -> str:
    """Move the damaged database (and its WAL files) aside; returns the new name."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    kept = db.with_name(f"{db.name}.corrupt-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        f = db.with_name(db.name + suffix)
        if f.exists():
            os.replace(f, kept.with_name(kept.name + suffix))
    return kept.name


def _dists(space: Space, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Optuna's (params, distributions) of a configuration; a value outside today's space keeps
    its own one-choice distribution."""
    from optuna.distributions import CategoricalDistribution

    from autotune.search.space import encode

    values, dists = {}, {}
    for name, value in params.items():
        p = space.params.get(name)
        if p is None or p.dist is None:
            continue
        values[name] = encode(value) if isinstance(p.dist, CategoricalDistribution) else value
        dists[name] = p.dist if p.contains(value) else CategoricalDistribution([encode(value)])
    return values, dists


def _running(study: optuna.Study, space: Space, params: dict[str, Any]) -> optuna.Trial:
    """A RUNNING trial with ``params`` appended to ``study`` (the next number)."""
    import optuna
    from optuna.trial import TrialState

    values, dists = _dists(space, params)
    study.add_trial(optuna.trial.create_trial(state=TrialState.RUNNING, params=values,
                                              distributions=dists))
    number = len(study.get_trials(deepcopy=False)) - 1
    return optuna.Trial(study, study._storage.get_trial_id_from_study_id_trial_number(
        study._study_id, number))


def _replay(study: optuna.Study, cfg: Config, space: Space, workdir: Path) -> str:
    """Tell trial ``workdir`` again from its spec and result; returns its source label."""
    from autotune.record import optuna_study as studylib
    from autotune.search import trials as trialslib
    from autotune.trial.spec import TrialResult
    from autotune.trial.spec import TrialSpec

    spec = TrialSpec.from_json((workdir / "spec.json").read_text())
    params = dict(spec.params)
    trial = _running(study, space, params)
    pred = space.engine.predict(params, cfg.engine.settings, cfg.engine.variants)
    studylib.mark_launched(trial, params, pred.stored())
    result_path = workdir / "result.json"
    if not result_path.exists():
        studylib.tell_fail(study, trial, params, trialslib.INTERRUPTED,
                           "interrupted (no result on disk; rebuilt by autotune repair)")
        return "interrupted"
    result = TrialResult.from_json(result_path.read_text())
    log = workdir / "trial.log"
    start = (workdir / "spec.json").stat().st_mtime
    end = log.stat().st_mtime if log.exists() else result_path.stat().st_mtime
    result = result.replace(duration_s=result.duration_s or max(0.0, end - start),
                            node=result.node or platform.node())  # as the runner fills them in
    attrs = {"role": "baseline"} if spec.number == 0 else {}
    if result.info.get("quality_from") is not None:  # quality numbers reused (quality.reuse)
        attrs["quality_from"] = result.info["quality_from"]
    studylib.tell(study, trial, cfg, params, result, attrs=attrs or None)
    return "trials/"


def _placeholder(study: optuna.Study, reason: str, params: dict[str, Any] | None = None) -> None:
    import optuna
    from optuna.trial import TrialState

    study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={
        "status": "failed", "reason": reason, "kind": LOST, "params": params or {}}))


def rebuild(study: optuna.Study, cfg: Config, space: Space, trials_dir: Path,
            backup: dict[int, Any]) -> Counter:
    """Append every trial to the empty ``study`` in number order; counts by source."""
    from optuna.trial import TrialState

    from autotune.record import optuna_study as studylib
    from autotune.search import trials as trialslib
    from autotune.search.trials import trial_attrs

    dirs = {int(d.name): d for d in trials_dir.glob("[0-9][0-9][0-9][0-9]") if (d / "spec.json").exists()}
    count: Counter = Counter()
    for n in range(max([*dirs, *backup], default=-1) + 1):
        old = backup.get(n)
        if old is not None and old.state in studylib.FINISHED:
            study.add_trial(old)
            count["optuna.db.bak"] += 1
        elif n in dirs:
            count[_replay(study, cfg, space, dirs[n])] += 1
        elif old is not None and old.state == TrialState.WAITING:
            study.add_trial(old)
            count["waiting"] += 1
        elif old is not None:  # RUNNING in the backup, never written to trials/
            params = trial_attrs(old).params or dict(old.params)
            trial = _running(study, space, params)
            studylib.tell_fail(study, trial, params, trialslib.INTERRUPTED, "interrupted (driver stopped)")
            count["interrupted"] += 1
        else:
            _placeholder(study, "lost with the damaged optuna.db: told after the last backup and "
                         "never launched (no trials/ directory); rebuilt by autotune repair")
            count[LOST] += 1
    return count


def repair(path: Path, force: bool = False) -> list[str]:
    """Rebuild ``path``'s Optuna study and MLflow runs; the lines to print."""
    import optuna

    from autotune.config.validate import compile_space
    from autotune.record import optuna_study as studylib
    from autotune.record.optuna_study import set_study_attr
    from autotune.record.resume import config_parts
    from autotune.record.storage import BACKUP_SUFFIX
    from autotune.record.storage import db_problem
    from autotune.record.storage import open_rdb
    from autotune.record.storage import sqlite_path
    from autotune.record.study_dirs import read_config
    from autotune.record.study_dirs import storage_url

    cfg = read_config(path)
    url = storage_url(path, cfg)
    db = sqlite_path(url)
    if db is None:
        raise ConfigError("study.storage", url, "repair rebuilds SQLite files only; restore a database "
                          "server from its own backups")
    why = db_problem(db) if db.exists() else "missing"
    if not why and not force:
        raise ConfigError(str(db), "readable", "nothing to repair (--force rebuilds it anyway)")
    space = compile_space(cfg)
    backup, attrs = _load_backup(db.with_name(db.name + BACKUP_SUFFIX), cfg.study.name)
    lines = [f"{db}: {why or 'readable (--force)'}"]
    if db.exists():
        lines.append(f"kept the damaged file as {db.parent / _set_aside(db)}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=open_rdb(url), study_name=cfg.study.name,
                                directions=studylib.directions(cfg),
                                sampler=optuna.samplers.RandomSampler(seed=0))
    for key, value in attrs.items():
        if value is not None:
            set_study_attr(study, key, value)
    if attrs.get(PARTS_ATTR) is None:
        set_study_attr(study, PARTS_ATTR, config_parts(cfg))
    count = rebuild(study, cfg, space, path / "trials", backup)
    launched = studylib.n_launched(study)
    lines.append(f"rebuilt {sum(count.values())} trials ({launched} launched): "
                 + ", ".join(f"{v} from {k}" if k in ("optuna.db.bak", "trials/") else f"{v} {k}"
                             for k, v in sorted(count.items())))
    if cfg.tracking.enabled:
        lines.append(_repair_mlflow(cfg, study))
    from autotune.record.storage import backup as write_backup

    write_backup(url)
    return lines


def _repair_mlflow(cfg: Config, study: optuna.Study) -> str:
    """Make the MLflow runs equal the rebuilt study; one line saying what changed."""
    from autotune.record.optuna_study import set_study_attr
    from autotune.record.optuna_study import study_attr
    from autotune.record.tracking import Tracker

    tracker = Tracker(cfg)
    parent = study_attr(study, PARENT_ATTR)
    found = None
    if parent:
        try:
            found = tracker.client.get_run(parent).info.run_id
        except Exception:  # noqa: BLE001 - the run is gone: look it up by its tag
            found = None
    if found is None:
        runs = tracker.client.search_runs([tracker.experiment_id],
                                          f"tags.`autotune.study` = '{cfg.study.name}'",
                                          order_by=["attributes.start_time DESC"], max_results=1)
        found = runs[0].info.run_id if runs else None
    if found is None:
        found = tracker.start_study(cfg.study.name, None, {"engine": cfg.engine.kind})
        tracker.client.set_terminated(found, "KILLED")
    tracker.parent_id = found
    set_study_attr(study, PARENT_ATTR, found)
    numbers = {t.number for t in study.get_trials(deepcopy=False)}
    deleted = 0
    for number, runs in tracker.trial_runs().items():
        if number not in numbers:
            for r in runs:
                tracker.client.delete_run(r.info.run_id)
                deleted += 1
    logged = tracker.reconcile(study)
    return f"MLflow: parent run {found}; {logged} trial runs logged, {deleted} deleted; MLflow = Optuna"

