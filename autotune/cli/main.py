"""Command line: ``autotune run|report|export|ui|ls|repair``.

``autotune run [conf=NAME] [OVERRIDES...] [--config-dir DIR] [--dry-run] [--fork NAME]`` runs
or resumes a study, holding its lock (:mod:`autotune.record.lock`); ``report``, ``export``,
``ui`` and ``ls`` read a study that exists (finished, interrupted or still running; see
:mod:`autotune.cli.commands`); ``repair`` rebuilds a damaged one (:mod:`autotune.record.repair`).

Bad input exits 2 with one line (key, value, what is allowed) before any trial starts and
before anything is written. Ctrl-C, SIGTERM and SIGHUP stop trials in flight, export what is
done and exit 130, 143 and 129 (:mod:`autotune.run.stop`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from autotune.errors import ConfigError

USAGE_EXAMPLES = """examples:
  autotune run                                   # default preset: local_cpu
  autotune run conf=local_cpu study.n_trials=12
  autotune run --config-dir ~/my-confs conf=my_box
  autotune run conf=hydra_cluster --dry-run
  autotune doctor                                # what this machine can run, with fixes
  autotune init ~/models/m.gguf --out ~/my-confs  # a preset for this box and this model
  autotune ls                                    # the studies under studies/
  autotune report studies/local_cpu              # summary again + report.html and PNGs
  autotune export studies/local_cpu --trial 7 --out /tmp/t7
  autotune ui studies/local_cpu                  # MLflow UI on 127.0.0.1 at the study's runs
  autotune repair studies/local_cpu              # rebuild a damaged optuna.db from trials/
  autotune run workload=long --fork local_cpu-long  # a new study seeded from local_cpu
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
    run.add_argument("--no-doctor", action="store_true", help="skip the engine's doctor checks "
                     "(autotune doctor) made before the first trial")
    run.add_argument("--fork", metavar="NAME", help="start study NAME seeded with the compatible "
                     "configurations of the study the overrides name (after a refused resume)")
    from autotune.cli.commands import add_parsers

    add_parsers(sub)
    from autotune.record.repair import add_parser as add_repair

    add_repair(sub)
    from autotune.cli.doctor import add_parser as add_doctor
    from autotune.cli.init import add_parser as add_init

    add_doctor(sub)
    add_init(sub)
    return p


def prepare(overrides: list[str], config_dir: str | None, dry_run: bool = False):
    """Compose, validate and compile: everything that can fail on bad input. Writes nothing."""
    from autotune.config.compose import compose
    from autotune.config.schema import load_config
    from autotune.config.validate import compile_space
    from autotune.config.validate import validate_all
    from autotune.search.space import baseline_params

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
        if not cfg.ray.address:
            from autotune.config.checks import validate_energy_counter

            validate_energy_counter([o.metric for o in cfg.objectives], [c.metric for c in cfg.constraints])
    return cfg, space, baseline


def cmd_run(args: argparse.Namespace) -> int:
    cfg, space, baseline = prepare(args.overrides, args.config_dir, args.dry_run)
    if args.dry_run:
        from autotune.run.plan import print_plan

        print_plan(cfg, space, baseline)
        return 0
    warnings: list[str] = []
    if not args.no_doctor:
        from autotune.cli.doctor import gate

        warnings = gate(cfg)  # the engine's doctor checks: a failure exits 2 with the doctor's line
    from autotune.cli.commands import after_run
    from autotune.cli.commands import study_started
    from autotune.output.report import Reporter
    from autotune.record.lock import StudyLock
    from autotune.record.resume import before_run
    from autotune.record.resume import fork_overrides
    from autotune.record.study_dirs import RUNNING_FILE
    from autotune.record.tracking import Tracker
    from autotune.run import stop
    from autotune.run.driver import Driver
    from autotune.run.placement import Placement

    source = None
    if args.fork:  # the fork is a new study: its own name, directory and lock
        source = cfg
        cfg, space, baseline = prepare([*args.overrides, *fork_overrides(cfg, args.fork)], args.config_dir)
    lock = StudyLock(cfg.study.dir).acquire()  # exit 2 naming the holder if another run has it
    try:
        notes, seeds = before_run(cfg, space, baseline, source)  # storage readable, resume comparable
        reporter = placement = None
        try:  # a stop anywhere from here on leaves no .running behind
            study_started(cfg)  # config.yaml + .running (validated: safe to write now)
            reporter = Reporter(cfg)
            for note in (lock.note, *notes):
                if note:
                    reporter.note(note)
            for line in warnings:  # the doctor's warnings (a busy CPU, a missing browser...)
                reporter.warn(line)
            tracker = Tracker(cfg) if cfg.tracking.enabled else None
            placement = Placement(cfg.ray)  # a SIGTERM during Ray's start-up: Stopped (run.stop)
            driver = Driver(cfg, space, placement, tracker, reporter, seeds=seeds,
                            fork_of=source.study.name if source else None)
            stop.check()  # a Ctrl-C that Ray's start-up swallowed
            summary = driver.run()
        finally:
            if reporter is not None:
                reporter.close()
            if placement is not None:
                placement.shutdown()
            stop.install()  # ray.shutdown leaves SIGTERM at its default: a stop now still exports
            (Path(cfg.study.dir) / RUNNING_FILE).unlink(missing_ok=True)  # we hold the study's lock
        after_run(cfg, reporter, summary, tracker.parent_id if tracker else None)
    finally:
        lock.release()
    return stop.exit_code(driver.stopped) if summary.interrupted or stop.received() else 0


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    args = _parser().parse_args(argv)
    from autotune.run import stop

    stop.install(fresh=True)  # Ctrl-C/SIGTERM/SIGHUP: one stop (the driver installs them again after ray.init)
    try:
        if args.command == "run":
            return cmd_run(args)
        return args.func(args)
    except ConfigError as e:
        print(f"autotune: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"autotune: interrupted ({stop.name(e)})", file=sys.stderr)
        return stop.exit_code(e)
    return 1


if __name__ == "__main__":
    sys.exit(main())
