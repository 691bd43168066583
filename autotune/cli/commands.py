"""The commands for a study that exists: ``report``, ``export``, ``ui`` and ``ls``.

Each reads the study's own files (:mod:`autotune.record.study_dirs`), works on a finished, an
interrupted or a running study, and refuses bad input with one line and exit code 2
(a :class:`~autotune.errors.ConfigError`). ``autotune run`` calls :func:`study_started`
(writes ``config.yaml`` and ``.running``) and :func:`after_run` (the report, logged to
MLflow) around the driver.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from autotune._files import write_atomic
from autotune._process_group import stop_process
from autotune.errors import ConfigError
from autotune.record.study_dirs import CONFIG_FILE
from autotune.record.study_dirs import RUNNING_FILE
from autotune.record.study_dirs import find_study
from autotune.record.study_dirs import read_config

if TYPE_CHECKING:
    from autotune.config.schema import Config
    from autotune.output.report import Reporter

START_TIMEOUT_S = 180.0
STUDY_HELP = "a study directory (default: the newest under ./studies); a bare name means studies/NAME"


def add_parsers(sub) -> None:
    """Add the sub-commands to ``autotune``'s parser."""
    fmt = argparse.RawDescriptionHelpFormatter
    rep = sub.add_parser("report", help="the summary again, report.html and PNG plots of a study",
                         description=cmd_report.__doc__, formatter_class=fmt)
    rep.add_argument("study_dir", nargs="?", help=STUDY_HELP)
    rep.add_argument("--out", help="where to write report.html and the PNGs (default: STUDY_DIR/report)")
    rep.add_argument("--no-png", action="store_true", help="skip the PNG images (no Chromium needed)")
    rep.set_defaults(func=cmd_report)
    exp = sub.add_parser("export", help="the engine's own files (and best.yaml) for any trial",
                         description=cmd_export.__doc__, formatter_class=fmt)
    exp.add_argument("study_dir", nargs="?", help=STUDY_HELP)
    exp.add_argument("--trial", type=int, help="trial number (default: the study's winner)")
    exp.add_argument("--out", help="output directory (default: STUDY_DIR/export/trial-NNNN)")
    exp.set_defaults(func=cmd_export)
    ui = sub.add_parser("ui", help="MLflow UI on 127.0.0.1 at the study's runs (Ctrl-C stops it)",
                        description=cmd_ui.__doc__, formatter_class=fmt)
    ui.add_argument("study_dir", nargs="?", help=STUDY_HELP)
    ui.add_argument("--port", type=int, default=5000, help="port on 127.0.0.1 (default 5000)")
    ui.add_argument("--optuna", action="store_true", help="optuna-dashboard on the study's storage instead")
    ui.set_defaults(func=cmd_ui)
    ls = sub.add_parser("ls", aliases=["status"], help="the studies under studies/: progress, best, running",
                        description=cmd_ls.__doc__, formatter_class=fmt)
    ls.add_argument("root", nargs="?", default="studies", help="folder of studies (default: studies)")
    ls.set_defaults(func=cmd_ls)


# ---- around `autotune run` ---------------------------------------------------------------
def _absolute_uri(uri: str) -> str:
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    return uri


def study_started(cfg: Config) -> Path:
    """Write ``config.yaml`` (tracking paths made absolute) and ``.running``; returns the latter."""
    d = Path(cfg.study.dir)
    d.mkdir(parents=True, exist_ok=True)
    raw = dict(cfg.raw)
    raw["tracking"] = {**raw.get("tracking", {}), "uri": _absolute_uri(cfg.tracking.uri),
                       "artifacts": str(Path(cfg.tracking.artifacts).resolve())}
    write_atomic(d / CONFIG_FILE, "# The resolved config of this study (written by autotune run).\n"
                 + yaml.safe_dump(raw, sort_keys=False))
    running = d / RUNNING_FILE
    write_atomic(running, f"{os.getpid()}\n")
    return running


def after_run(cfg: Config, reporter: Reporter) -> None:
    """Write the HTML report and log it to the MLflow parent run; never fails the run."""
    from autotune.output.report_html import write_report

    if not cfg.report.enabled:
        return
    try:
        files = write_report(Path(cfg.study.dir), Path(cfg.study.dir) / "report", png=cfg.report.png)
        reporter.note("report: " + ", ".join(str(f) for f in files if f.suffix == ".html"))
        _log_report(Path(cfg.study.dir), files)
    except Exception as e:  # noqa: BLE001 - the study itself is done and exported
        reporter.warn(f"the report could not be written: {e}")


def _log_report(path: Path, files: list[Path]) -> None:
    """Log the report to the study's MLflow parent run (if the study is tracked)."""
    from autotune.record.mlflow_view import PARENT_ATTR
    from autotune.record.mlflow_view import log_report
    from autotune.record.optuna_study import study_attr
    from autotune.record.study_dirs import load_study

    config = read_config(path)
    parent = study_attr(load_study(path, config), PARENT_ATTR)
    if config.tracking.enabled and parent:
        log_report(config.tracking.uri, parent, files)


# ---- the commands --------------------------------------------------------------------------
def cmd_report(args: argparse.Namespace) -> int:
    """Print the study's summary again and write report.html (self-contained: Pareto front
    with the winner and the baseline, best so far over trials, parameter importances, every
    trial with its status and reason, constraints, noise verdict) and PNGs of the plots."""
    from autotune.output.report import print_summary
    from autotune.output.report_html import write_report

    path = find_study(args.study_dir)
    out = Path(args.out) if args.out else path / "report"
    files = write_report(path, out, png=not args.no_png)
    print_summary(path)
    print("report: " + ", ".join(str(f) for f in files))
    try:
        _log_report(path, files)
    except Exception as e:  # noqa: BLE001 - the files are written; MLflow is a copy
        print(f"warning: not logged to MLflow: {e}", file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write the engine's own files (llama-server.sh, llama_cpp_kwargs.json, tabbyapi.yml,
    vllm-serve.sh...) and best.yaml for any trial of a study, with real model file paths."""
    from autotune.output.export import export_trial

    path = find_study(args.study_dir)
    files, notes = export_trial(path, args.trial, Path(args.out) if args.out else None)
    for n in notes:
        print(f"warning: {n}")
    print("files: " + ", ".join(str(f) for f in files))
    return 0


def _wait_http(url: str, proc: subprocess.Popen, timeout_s: float) -> bool:
    """Poll ``url`` until it answers (any status below 500) or ``proc`` exits."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2.0) as r:
                if r.status < 500:
                    return True
        except urllib.error.HTTPError as e:
            if e.code < 500:
                return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def _serve(argv: list[str], health: str, url: str, name: str) -> int:
    """Run a server in its own process group until Ctrl-C / SIGTERM; then stop the group."""
    import tempfile

    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(argv, start_new_session=True, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        if not _wait_http(health, proc, START_TIMEOUT_S):
            log.seek(0)
            last = ([x for x in log.read().splitlines() if x.strip()] or [f"no answer in {START_TIMEOUT_S:.0f} s"])[-1]
            print(f"autotune: error: {name} did not start: {last}", file=sys.stderr)
            return 1
        print(f"{name} on {url}  (Ctrl-C stops it)", flush=True)
        proc.wait()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        stop_process(proc, grace_s=20)
        log.close()


def cmd_ui(args: argparse.Namespace) -> int:
    """Start the MLflow UI on 127.0.0.1 at the study's experiment, in its runs table (the
    trials as rows, grouped under the study's parent run); --optuna starts optuna-dashboard
    on the study's Optuna storage instead. Ctrl-C stops it."""
    from autotune.record.mlflow_view import experiment_url
    from autotune.record.study_dirs import storage_url

    if not 1 <= args.port <= 65535:
        raise ConfigError("--port", args.port, "expected a port number 1-65535")
    path = find_study(args.study_dir)
    config = read_config(path)
    from autotune.record.storage import check_db

    check_db(path, storage_url(path, config))  # an unreadable optuna.db: one line, exit 2
    base = f"http://127.0.0.1:{args.port}"
    if args.optuna:
        exe = shutil.which("optuna-dashboard")
        if exe is None:
            raise ConfigError("--optuna", "optuna-dashboard", "not installed; pip install optuna-dashboard")
        argv = [exe, storage_url(path, config), "--host", "127.0.0.1", "--port", str(args.port)]
        return _serve(argv, base, base, "optuna-dashboard")
    uri = config.tracking.uri
    # one worker and no job runner: a local UI for one person starts in seconds, not minutes
    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
            "--host", "127.0.0.1", "--port", str(args.port), "--workers", "1"]
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    return _serve(argv, f"{base}/health", experiment_url(base, config), "MLflow UI")


def cmd_ls(args: argparse.Namespace) -> int:
    """List the studies under a folder: trials done of the budget, feasible ones, the best
    value so far and its speed-up over trial 0, and whether the study is running."""
    from autotune.output.report import print_studies
    from autotune.record.study_dirs import state_of
    from autotune.record.study_dirs import study_dirs

    root = Path(args.root)
    if not root.is_dir():
        raise ConfigError("ls", args.root, "not a directory of studies")
    states, broken = [], 0
    for d in study_dirs(root):
        try:
            states.append(state_of(d))
        except ConfigError as e:  # e.g. an unreadable optuna.db: one line, the others listed
            print(f"autotune: error: {d}: {e}", file=sys.stderr)
            broken += 1
    print_studies(states)
    return 2 if broken else 0
