"""The check of llama.cpp's exported files (``Engine.check_export`` of ``llamacpp``).

- ``llama-server.sh``: its command line against the flags of the llama-server that the
  installed llama-cpp-python ships (:mod:`autotune.engines.llamacpp.server_flags`), and the
  model file it names; what does not hold is also written into the script as WARNING
  comments;
- ``llama_cpp_kwargs.json``: the ``model_path`` it names exists.

Any engine that exports these files (e.g. a llama-server engine) can reuse
:func:`check_llama_files`.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from autotune._files import insert_comments
from autotune.engines.llamacpp.server_flags import argv_reasons


def check_server_script(path: Path) -> list[str]:
    """Reasons the script's last command line would not run (unknown flags, a missing model)."""
    lines = [x for x in path.read_text().splitlines() if x and not x.startswith("#")]
    argv = shlex.split(lines[-1])
    found = argv_reasons(argv)
    model = argv[argv.index("-m") + 1] if "-m" in argv else None
    if model and not Path(model).exists():
        found.append(f"model file {model} does not exist")
    insert_comments(path, [f"WARNING: {x}" for x in found])
    return [f"{path.name}: {x}" for x in found]


def check_kwargs_json(path: Path) -> list[str]:
    """The ``model_path`` of ``llama_cpp_kwargs.json`` exists."""
    model = json.loads(path.read_text()).get("model_path")
    if model and not Path(model).exists():
        return [f"{path.name}: model_path {model} does not exist"]
    return []


def check_llama_files(files: list[Path]) -> list[str]:
    """Notes on every ``llama-server.sh`` and ``llama_cpp_kwargs.json`` among ``files``."""
    notes: list[str] = []
    for f in files:
        if f.name == "llama-server.sh":
            notes += check_server_script(f)
        elif f.name == "llama_cpp_kwargs.json":
            notes += check_kwargs_json(f)
    return notes
