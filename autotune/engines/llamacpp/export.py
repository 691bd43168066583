"""llama.cpp's exported form: the equivalent ``llama-server`` command (:func:`server_argv`), and
the check of the exported files (``Engine.check_export`` of ``llamacpp``).

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


def server_argv(p: dict, model_path: str, port: int = 8080) -> list[str]:
    """The ``llama-server`` argv equivalent to the full parameters ``p`` of a llamacpp trial
    (newest flag spellings, ENGINE_KNOBS §4.3)."""
    argv = [
        "llama-server", "-m", model_path, "-t", str(p["n_threads"]), "-tb", str(p["n_threads_batch"]),
        "-c", str(p["n_ctx"]), "-b", str(p["n_batch"]), "-ub", str(p["n_ubatch"]),
        "-fa", "on" if p["flash_attn"] else "off", "-ctk", p["type_k"], "-ctv", p["type_v"],
        "-ngl", str(p["n_gpu_layers"]),
    ]
    if p["n_gpu_layers"]:
        argv += ["-sm", p["split_mode"], "-mg", str(p["main_gpu"])]
        if p.get("tensor_split"):
            argv += ["-ts", ",".join(str(x) for x in p["tensor_split"])]
    # llama.cpp of llama-cpp-python 0.3.36 replaced --no-mmap / --mlock with --load-mode
    mode = {(True, False): None, (False, False): "none", (True, True): "mmap+mlock",
            (False, True): "mlock"}[(bool(p["use_mmap"]), bool(p["use_mlock"]))]
    if mode:
        argv += ["-lm", mode]
    if p["draft"] == "prompt_lookup":
        argv += ["--spec-type", "ngram-simple", "--spec-draft-n-max", str(p["draft_k"])]
    return argv + ["--host", "127.0.0.1", "--port", str(port)]
