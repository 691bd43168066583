"""Exports written atomically into the study directory: the Pareto front, the winner as a
reusable preset, the winner in the engine's own form, and a summary.

- ``pareto.json`` / ``pareto.csv``: each feasible Pareto trial (number, params, metrics);
- ``best.yaml``: the full resolved config with the winner's parameters fixed, usable as a
  preset (``autotune run --config-dir <study dir> conf=best``);
- engine-native files from ``Engine.export`` (``llama-server.sh``, ``llama_cpp_kwargs.json``,
  ``tabbyapi.yml``, ``vllm-serve.sh``...);
- ``summary.json``: winner, baseline, speed-up, noise verdict.
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

from autotune.trial.spec import write_atomic

if TYPE_CHECKING:
    from autotune.config import Config
    from autotune.select import Record
    from autotune.space import Space


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


def write_all(out_dir: Path, cfg: Config, space: Space, front: list[Record], winner: Record | None,
              summary: dict[str, Any]) -> list[Path]:
    """Everything at once; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = write_pareto(out_dir, front, [o.metric for o in cfg.objectives])
    if winner is not None:
        header = (f"Winner of study {cfg.study.name}: trial {winner.number}.\n"
                  f"Re-run it with: autotune run --config-dir {out_dir} conf=best")
        files.append(write_best(out_dir, cfg, space, winner.params, header))
        files += space.engine.export(winner.params, cfg.engine.settings, cfg.engine.variants, out_dir)
    spath = out_dir / "summary.json"
    write_atomic(spath, _json(summary))
    files.append(spath)
    return files
