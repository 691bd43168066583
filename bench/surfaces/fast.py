"""One study on a simulated surface in seconds: the real driver loop, without Ray or MLflow.

:func:`fast_study` composes the same configuration as ``autotune run --config-dir
bench/surfaces conf=SURFACE ...`` (``autotune.cli.main.prepare``), builds the real
:class:`~autotune.run.driver.Driver` (its pool, prior, startup design and
``make_sampler``'s sampler), enqueues trial 0 and the design as the CLI does
(``studylib.enqueue_initial``), and runs the driver's own ask/tell loop
(``Driver._loop``: rules, the precheck, duplicates, refusals) on an in-memory Optuna study.
Only the placement differs: :class:`SimPlacement` renders the trial's argv as the command
engine would (``CommandEngine.build_argv``) and evaluates ``sim.py``'s model in-process on
that argv, with the same seeded noise. After the loop the driver's own end-of-study
re-measurement picks the winner (``Driver.choose_winner``: the ``select.top_k`` candidates
and the baseline re-run side by side, the CLI's run numbers and so its noise). Not done: the
exports and the summary.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import sim  # noqa: E402
from models import SimFailure  # noqa: E402


class SimPlacement:
    """The placement interface the driver uses, running each trial at once in-process."""

    def __init__(self) -> None:
        self._ids = itertools.count()
        self._done: dict[int, Any] = {}
        self.runs = 0  # configurations evaluated (trials and re-measurements)

    def default_slots(self) -> int:
        return 1

    def fits(self, res: Any) -> str:
        return ""

    def run_now(self, spec: Any, res: Any) -> Any:
        from autotune.engines.command import CommandEngine
        from autotune.trial.spec import TrialResult

        self.runs += 1
        argv = CommandEngine.build_argv(spec.params, spec.settings, spec.variants,
                                        CommandEngine._builtins(spec.workdir, {}))
        surface, params, workdir, noise, noise_seed, instance = sim.parse([str(a) for a in argv[2:]])
        try:
            metrics = sim.measure(surface, params, workdir, noise, noise_seed, instance)
        except SimFailure as e:
            return TrialResult(spec.number, "failed", reason=str(e).splitlines()[0])
        return TrialResult(spec.number, "ok", {k: round(v, 4) for k, v in metrics.items()})

    def submit(self, spec: Any, res: Any) -> int:
        ref = next(self._ids)
        self._done[ref] = self.run_now(spec, res)
        return ref

    def wait(self, refs: list, timeout_s: float) -> list:
        return [r for r in refs if r in self._done]

    def wait_all_done(self, refs: list) -> list:
        return self.wait(refs, 0.0)

    def result(self, ref: int, number: int) -> Any:
        return self._done.pop(ref)

    def cancel(self, ref: int) -> None:
        self._done.pop(ref, None)

    def stop_all(self, refs: list) -> None:
        for ref in refs:
            self.cancel(ref)

    def shutdown(self) -> None:
        self._done.clear()


class Quiet:
    """A reporter that prints nothing (the driver's report.started/finished/note/warn, and its
    slow_step context)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None

    def slow_step(self, what: str, after_s: float = 0.0) -> contextlib.nullcontext:
        return contextlib.nullcontext()


def fast_study(overrides: list[str], config_dir: Path = HERE,
               placement: SimPlacement | None = None) -> tuple[list[dict], float, dict]:
    """Run one study in-process; ([{number, params, status, metrics, reason}] of the launched trials
    in launch order, seconds, the winner: {number, params, remeasured: [trial numbers re-run],
    runs: re-measurement launches}, empty when nothing was feasible). ``placement``: another
    in-process placement (bench/time_to_answer.py's, which keeps a virtual clock)."""
    import optuna

    from autotune.cli.main import prepare
    from autotune.record import optuna_study as studylib
    from autotune.run.driver import Driver
    from autotune.search import trials as trialslib
    from autotune.search.samplers import make_sampler

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="autotune-fast-") as tmp:
        cfg, space, baseline = prepare([*overrides, f"study.dir={tmp}", "tracking.enabled=false",
                                        "report.enabled=false"], str(config_dir), dry_run=True)
        driver = Driver(cfg, space, placement or SimPlacement(), None, Quiet())
        st = cfg.study
        sampler = make_sampler(st.sampler, st.seed, space, st.n_trials, driver.n_startup(), st.search,
                               pool=driver.pool, constraints=cfg.constraints,
                               objectives=studylib.told_names(cfg))
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(directions=studylib.directions(cfg), sampler=sampler)
        studylib.enqueue_initial(study, space, baseline, list(st.enqueue), driver.design(baseline))
        driver._loop(study, time.monotonic())
        recs = studylib.records(study)
        searched = driver.launcher.placement.runs
        verdict = driver.choose_winner(recs)
        launched = sorted((r for r in recs if r.kind == trialslib.LAUNCHED), key=lambda r: r.number)
    trials = [{"number": r.number, "params": r.params, "status": r.status, "metrics": r.metrics,
               "reason": r.reason} for r in launched]
    remeasured = sorted(int(r.trial) for r in verdict.remeasured_rows())
    winner = {} if verdict.winner is None else {"number": verdict.winner.number, "params": verdict.winner.params,
                                                "remeasured": remeasured, "runs": driver.launcher.placement.runs - searched}
    return trials, time.monotonic() - t0, winner
