"""Which TabbyAPI branch a ``config.yml`` is for, and its check against that branch's model.

``backend: exllamav2`` is the exl2-checkpoint branch (:mod:`.schema_exl2`); anything else
(``exllamav3``, or none) is main (:mod:`.schema_main`). :func:`check_tabby_files` is
``Engine.check_export`` of every engine that writes a ``tabbyapi.yml`` (``exllamav2``,
``exllamav3``, ``tabbyapi``): what does not hold is returned as a note and written into the
file as WARNING comments.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from autotune._files import insert_comments
from autotune._files import write_atomic
from autotune.engines.tabbyapi import schema_exl2
from autotune.engines.tabbyapi import schema_main

BRANCH_OF_BACKEND = {"exllamav2": "exl2-checkpoint", "exllamav3": "main"}


def branch_of(config: dict) -> str:
    """``"exl2-checkpoint"`` for ``model.backend: exllamav2``, else ``"main"``."""
    backend = ((config or {}).get("model") or {}).get("backend")
    return BRANCH_OF_BACKEND.get(backend, "main")


def validate(config: dict, branch: str | None = None) -> list[str]:
    """Problems TabbyAPI's ``branch`` (default: from the backend) would have with ``config``."""
    branch = branch or branch_of(config)
    schema = schema_exl2 if branch == "exl2-checkpoint" else schema_main
    return schema.validate(config)


def check_tabby_yaml(path: Path) -> list[str]:
    """Reasons TabbyAPI would refuse the config at ``path`` (also written into it)."""
    found = validate(yaml.safe_load(path.read_text()) or {})
    insert_comments(path, [f"WARNING (TabbyAPI config check): {x}" for x in found])
    return [f"{path.name}: {x}" for x in found]


def check_tabby_files(files: list[Path]) -> list[str]:
    """Notes on every ``tabbyapi.yml`` among ``files``."""
    return [note for f in files if f.name == "tabbyapi.yml" for note in check_tabby_yaml(f)]


def write_tabby_files(out_dir: Path, text: str, warnings: list[str]) -> list[Path]:
    """``tabbyapi.yml`` (``text``) and, when TabbyAPI cannot run what was measured,
    ``tabbyapi_warnings.txt``: the export of every engine that writes one."""
    files = [out_dir / "tabbyapi.yml"]
    write_atomic(files[0], text)
    if warnings:
        files.append(out_dir / "tabbyapi_warnings.txt")
        write_atomic(files[-1], "\n".join(warnings) + "\n")
    return files
