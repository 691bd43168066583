"""Exports written atomically into the study directory: the Pareto front, the winner as a
reusable preset, the winner in the engine's own form, and a summary.

- ``pareto.json`` / ``pareto.csv``: each feasible Pareto trial (number, params, metrics);
- ``best.yaml``: the full resolved config with the winner's parameters fixed, usable as a
  preset (``autotune run --config-dir <study dir> conf=best``);
- engine-native files from ``Engine.export`` (``llama-server.sh``, ``llama_cpp_kwargs.json``,
  ``tabbyapi.yml``, ``vllm-serve.sh``...);
- ``summary.json``: winner, baseline, speed-up, noise verdict.

Exports name real files: a shipped model (``package``) resolves to its assembled GGUF and a
made variant (``recipe``) to its cached file, and each export is checked by its engine
(``Engine.check_export``: llama-server flags against the llama.cpp llama-cpp-python ships,
model files exist, ``tabbyapi.yml`` against TabbyAPI's config model) before it is left for
the user. What does not hold is said in the file and in the summary's warnings.
"""

from __future__ import annotations

import copy
import csv
import io
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import yaml

from autotune._files import insert_comments
from autotune._files import write_atomic

if TYPE_CHECKING:
    from autotune.config.schema import Config
    from autotune.engines.base import Engine
    from autotune.record.summary import StudySummary
    from autotune.search.space import Space
    from autotune.search.trials import Record


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"


def write_pareto(out_dir: Path, front: list[Record], objectives: list[str]) -> list[Path]:
    """pareto.json and pareto.csv (columns: number, objectives, params..., other metrics...)."""
    rows = [asdict(r) for r in front]
    jpath = out_dir / "pareto.json"
    write_atomic(jpath, _json({"objectives": objectives, "trials": rows}))
    params = sorted({k for r in front for k in r.params})
    metrics = objectives + sorted({k for r in front for k in r.metrics} - set(objectives))
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["number", *params, *metrics])
    for r in front:
        w.writerow([r.number, *(r.params.get(p, "") for p in params), *(r.metrics.get(m, "") for m in metrics)])
    cpath = out_dir / "pareto.csv"
    write_atomic(cpath, buf.getvalue())
    return [jpath, cpath]


def best_config(cfg: Config, space: Space, params: dict[str, Any]) -> dict:
    """The resolved config with the winner's parameters as fixed values (a preset)."""
    data = copy.deepcopy(cfg.raw)
    data["space"] = {name: {"type": "fixed", "value": params[name]} for name in space.params if name in params}
    data["study"]["name"] = f"{cfg.study.name}-best"
    data["study"]["dir"] = f"{cfg.study.dir}-best"
    data["study"]["enqueue"] = []
    data["study"]["n_trials"] = 1
    return data


def write_best(out_dir: Path, cfg: Config, space: Space, params: dict[str, Any], header: str) -> Path:
    path = out_dir / "best.yaml"
    text = yaml.safe_dump(best_config(cfg, space, params), sort_keys=False)
    write_atomic(path, "".join(f"# {line}\n" for line in header.splitlines()) + text)
    return path


def _referenced_variants(cfg: Config, space: Space, params: dict[str, Any]) -> list[str]:
    """Variant names the configuration uses (its model, draft model...)."""
    engine = space.engine
    try:
        full = {**engine.default_params(cfg.engine.settings, cfg.engine.variants), **params}
    except Exception:  # noqa: BLE001 - an engine without defaults: the params alone
        full = dict(params)
    return list(dict.fromkeys(full[k] for k in engine.variant_knobs(full)
                              if isinstance(full[k], str) and full[k] in cfg.engine.variants))


def export_reasons(engine: type[Engine], files: list[Path]) -> list[str]:
    """What would stop an exported file from running as it is: the engine's own check
    (:meth:`~autotune.engines.base.Engine.check_export`), which may also write WARNING
    comments into the files."""
    return engine.check_export(files)


def write_native(out_dir: Path, cfg: Config, space: Space, params: dict[str, Any],
                 label: str) -> tuple[list[Path], list[str]]:
    """The engine's own files for one configuration, naming real model files; (files, notes).

    Shipped and made variants resolve to their cached files (made now if missing). Every
    file is then checked (:func:`export_reasons`); what does not hold is written into the
    file as a comment and returned as a note for the summary.
    """
    from autotune.engines.variants import export_variants
    from autotune.engines.variants import variant_origin

    names = _referenced_variants(cfg, space, params)
    variants, notes = export_variants(names, cfg.engine.variants)
    files = space.engine.export(params, cfg.engine.settings, variants, out_dir)
    origin = [f"{label}. Model files:"] + [
        f"  {variant_origin(n, cfg.engine.variants)} -> {variants[n].get('path', '(not made)')}" for n in names]
    if any("path" not in cfg.engine.variants[n] for n in names):
        origin.append("  Made files live in autotune's cache; best.yaml (engine.variants) rebuilds them.")
    for f in files:
        if f.suffix in (".sh", ".yml", ".yaml"):
            insert_comments(f, origin)
    return files, notes + export_reasons(space.engine, files)


def write_all(out_dir: Path, cfg: Config, space: Space, front: list[Record], winner: Record | None,
              summary: StudySummary) -> list[Path]:
    """Everything at once; returns the files written.

    The notes of the export checks are added to the summary's warnings in ``summary.json``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    files = write_pareto(out_dir, front, [o.metric for o in cfg.objectives])
    notes: list[str] = []
    if winner is not None:
        header = (f"Winner of study {cfg.study.name}: trial {winner.number}.\n"
                  f"Re-run it with: autotune run --config-dir {out_dir} conf=best\n"
                  "engine.variants below says how each model file is obtained (made variants are\n"
                  "re-made from their base on first use).")
        files.append(write_best(out_dir, cfg, space, winner.params, header))
        native, notes = write_native(out_dir, cfg, space, winner.params,
                                     f"Winner of study {cfg.study.name}: trial {winner.number}")
        files += native
    spath = out_dir / "summary.json"
    write_atomic(spath, summary.with_warnings(notes).to_json())
    files.append(spath)
    return files


def export_trial(path: Path, number: int | None, out: Path | None) -> tuple[list[Path], list[str]]:
    """``autotune export``: best.yaml and the native files of trial ``number`` of a study.

    ``number`` None means the winner in ``summary.json`` (else the best feasible trial so far,
    for a study that has not ended). Returns (files, notes).
    """
    from autotune.config.validate import compile_space
    from autotune.errors import ConfigError
    from autotune.record.optuna_study import records
    from autotune.record.study_dirs import best_feasible
    from autotune.record.study_dirs import load_study
    from autotune.record.study_dirs import read_config
    from autotune.record.study_dirs import read_summary

    cfg = read_config(path)
    space = compile_space(cfg)
    recs = {r.number: r for r in records(load_study(path, cfg))}
    if number is None:
        summary = read_summary(path)
        winner = summary.winner if summary else None
        rec = recs.get(winner.number) if winner else best_feasible(list(recs.values()), cfg.select.metric)
        if rec is None:
            raise ConfigError("--trial", None, "the study has no feasible trial yet; name one with --trial N")
    elif number not in recs:
        raise ConfigError("--trial", number, f"no finished trial with that number; finished: "
                          f"{', '.join(map(str, sorted(recs))) or 'none'}")
    else:
        rec = recs[number]
    out = out or path / "export" / f"trial-{rec.number:04d}"
    out.mkdir(parents=True, exist_ok=True)
    label = f"Trial {rec.number} of study {cfg.study.name} ({rec.status}{', feasible' if rec.feasible else ''})"
    files = [write_best(out, cfg, space, rec.params, f"{label}.\nRe-run it with: autotune run "
                        f"--config-dir {out} conf=best")]
    native, notes = write_native(out, cfg, space, rec.params, label)
    if rec.status != "ok":
        notes.insert(0, f"trial {rec.number} was not measured ({rec.status}: {rec.reason}); "
                        "these files describe its configuration only")
    if notes:
        npath = out / "export_notes.txt"
        write_atomic(npath, "".join(f"{n}\n" for n in notes))
        native.append(npath)
    return files + native, notes
