"""``autotune doctor [--engine NAME] [--json] [--model GGUF]``: what this machine can run.

Each line is a :class:`~autotune.engines.doctor.Check` (verdict ok | warn | fail | skip, and the
one command that fixes a failure): this machine's (:mod:`autotune.cli._checks`), then each
engine's own (:meth:`~autotune.engines.base.Engine.doctor_checks`: llama.cpp's is a real
one-token decode in a subprocess, on the shipped gemma model or ``--model``). The exit status is
0 when every check the chosen engine needs passes (default llamacpp), 1 otherwise.

``autotune run`` calls :func:`gate` after validating the config and before writing anything:
the chosen engine's :meth:`~autotune.engines.base.Engine.gate_checks` (fast; llama.cpp caches a
passing decode per build), a failure stops the run with the doctor's line (exit 2).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.cli._checks import check_chromium
from autotune.cli._checks import check_cpu
from autotune.cli._checks import check_gpus
from autotune.cli._checks import check_load
from autotune.cli._checks import check_mlflow
from autotune.cli._checks import check_ray
from autotune.engines.doctor import Check
from autotune.errors import AutotuneError
from autotune.errors import ConfigError
from autotune.errors import unknown_name
from autotune.registry import ENGINES
from autotune.registry import get_engine_class

if TYPE_CHECKING:
    from autotune.config.schema import Config

DESCRIPTION = ("Check what this machine can run: one line per check with its verdict and the "
               "command that fixes a failure. Exit 0 when every check --engine needs passes, else 1.")
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


# ---- all checks ------------------------------------------------------------------------------
def engine_checks(model: Path | None = None) -> list[Check]:
    """Each engine's own checks (:meth:`Engine.doctor_checks`), in the registry's order; a check
    several engines share (ExLlamaV2 and V3 share torch's) is listed once."""
    seen: dict[str, Check] = {}
    for kind in ENGINES:
        for c in get_engine_class(kind).doctor_checks(model):
            seen.setdefault(c.name, c)
    return list(seen.values())


def run_checks(model: Path | None = None) -> list[Check]:
    """Every check of ``autotune doctor`` on this machine."""
    out = check_cpu() + check_gpus() + engine_checks(model)
    return out + check_ray() + check_mlflow() + check_chromium()


def blocking(checks: list[Check], engine: str) -> list[Check]:
    """The failed checks that ``engine`` needs."""
    return [c for c in checks if c.verdict == "fail" and engine in c.engines]


def gate_checks(cfg: Config) -> list[Check]:
    """The checks ``autotune run`` makes for ``cfg``'s engine before it writes anything."""
    from autotune.engines.predict import as_dict

    out = check_mlflow(cfg.tracking.uri) if cfg.tracking.enabled else []
    engine = get_engine_class(cfg.engine.kind)
    return [check_load()] + out + engine.gate_checks(as_dict(cfg.engine.settings), dict(cfg.space or {}))


def gate(cfg: Config) -> list[str]:
    """Raise :class:`DoctorFailed` for the first failed check of ``cfg``'s engine; return the
    lines of its warnings, which the run prints once the study has started (a bad input found
    after the gate is still the only line on stderr)."""
    checks = gate_checks(cfg)
    failed = blocking(checks, cfg.engine.kind)
    if failed:
        raise DoctorFailed(failed[0])
    return [c.line() for c in checks if c.verdict == "warn" and cfg.engine.kind in c.engines]


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
