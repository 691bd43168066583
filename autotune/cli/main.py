"""Command line: ``autotune run|report|export|ui|ls``.

``autotune run [conf=NAME] [OVERRIDES...] [--config-dir DIR] [--dry-run]`` runs or resumes a
study; ``report``, ``export``, ``ui`` and ``ls`` read a study that exists (finished,
interrupted or still running; see :mod:`autotune.cli.commands`).

Bad input exits 2 with one line (key, value, what is allowed) before any trial starts and
before anything is written. Ctrl-C stops trials in flight, exports what is done, exits 130.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from autotune.errors import ConfigError

USAGE_EXAMPLES = """examples:
  autotune run                                   # default preset: local_cpu
  autotune run conf=local_cpu study.n_trials=12
  autotune run --config-dir ~/my-confs conf=my_box
  autotune run conf=hydra_cluster --dry-run
  autotune ls                                    # the studies under studies/
  autotune report studies/local_cpu              # summary again + report.html and PNGs
  autotune export studies/local_cpu --trial 7 --out /tmp/t7
  autotune ui studies/local_cpu                  # MLflow UI on 127.0.0.1 at the study's runs
"""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``autotune: error: ...``, exit 2), no usage dump."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="autotune", epilog=USAGE_EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or resume) a study", epilog=USAGE_EXAMPLES,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("overrides", nargs="*", help="conf=PRESET and Hydra overrides (key=value)")
    run.add_argument("--config-dir", help="a directory of your own presets (searched first)")
    run.add_argument("--dry-run", action="store_true", help="print the plan; run no trial")
    from autotune.cli.commands import add_parsers

    add_parsers(sub)
    return p


def prepare(overrides: list[str], config_dir: str | None, dry_run: bool = False):
    """Compose, validate and compile: everything that can fail on bad input. Writes nothing."""
    from autotune.config.compose import compose
    from autotune.config.schema import load_config
    from autotune.config.validate import validate_all
    from autotune.search.space import baseline_params
    from autotune.search.space import compile_space

    cfg = load_config(compose(overrides, config_dir))
    space = compile_space(cfg)
    baseline = baseline_params(space, cfg.engine.variants)
    validate_all(cfg, space, baseline)
    if not dry_run:
        missing = space.engine.preflight(cfg.engine.settings)
        if missing:
            raise ConfigError("engine.settings.gpus", cfg.engine.kind, missing[0])
        from autotune.config.checks import validate_model_paths

        validate_model_paths(cfg.engine.variants)  # real runs only: --dry-run works anywhere
    return cfg, space, baseline


def cmd_run(args: argparse.Namespace) -> int:
    cfg, space, baseline = prepare(args.overrides, args.config_dir, args.dry_run)
    if args.dry_run:
        from autotune.output.plan import print_plan

        print_plan(cfg, space, baseline)
        return 0
    from autotune.cli.commands import after_run
    from autotune.cli.commands import study_started
    from autotune.output.report import Reporter
    from autotune.record.tracking import Tracker
    from autotune.run.driver import Driver
    from autotune.run.placement import Placement

    running = study_started(cfg)  # config.yaml + .running (validated: safe to write now)
    reporter = Reporter(cfg)
    tracker = Tracker(cfg) if cfg.tracking.enabled else None
    placement = Placement(cfg.ray)
    try:
        summary = Driver(cfg, space, placement, tracker, reporter).run()
    finally:
        reporter.close()
        placement.shutdown()
        running.unlink(missing_ok=True)
    after_run(cfg, reporter)
    interrupted = summary.get("interrupted") if isinstance(summary, dict) else summary.interrupted
    return 130 if interrupted else 0


def _sigterm(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        if args.command == "run":
            return cmd_run(args)
        return args.func(args)
    except ConfigError as e:
        print(f"autotune: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autotune: interrupted", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
