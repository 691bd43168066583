"""The trial worker process: ``python -m autotune.trial.worker SPEC.json RESULT.json``.

This is the only place engines are loaded. It runs one spec, writes one result file, and
dies with its guard (:mod:`autotune.trial.guard`): a watchdog kills the whole process group
if the guard goes away (checked from the start, against the pid the guard passed) or the
trial outlives its timeout, so no engine or server outlives its trial.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from autotune._files import write_atomic
from autotune.errors import InfeasibleConfig
from autotune.measure import early_stop
from autotune.measure.energy import EnergyMeter
from autotune.measure.energy import energy_metrics
from autotune.measure.energy import find_counters
from autotune.measure.energy import measured_tokens
from autotune.measure.quality import load_text
from autotune.measure.quality import save_reference
from autotune.registry import get_engine_class
from autotune.trial.guard import GUARD_ENV
from autotune.trial.spec import TrialResult
from autotune.trial.spec import TrialSpec


def _watchdog(timeout_s: float, parent: int) -> None:
    deadline = time.monotonic() + timeout_s + 10
    while True:  # checked before the first sleep: the guard may have gone while this started
        if os.getppid() != parent or time.monotonic() > deadline:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        time.sleep(0.5)


def execute(spec: TrialSpec) -> TrialResult:
    """Start the engine, measure speed, memory and quality, stop it; never raises."""
    cls = get_engine_class(spec.engine)
    engine = cls(spec.settings, spec.variants, spec.params, Path(spec.workdir))
    times: dict[str, float] = {}  # the phases done, in s (a failed trial keeps those it finished)
    try:
        refused = cls.check(spec.params, spec.settings)  # the contract: never start what check refuses
        if refused:
            raise InfeasibleConfig("; ".join(refused))
        t = time.perf_counter()
        engine.start()
        times["load"] = load_s = time.perf_counter() - t
        t = time.perf_counter()
        if spec.mode == "reference":
            tokens, logits = engine.logprobs(load_text(spec.quality.text), spec.quality.n_tokens)
            meta = save_reference(Path(spec.quality.reference_dir), tokens, logits)
            times["quality"] = time.perf_counter() - t
            return TrialResult(spec.number, "ok", {"ppl": meta["ppl"]}, info=engine.info, times_s=times)
        counters, no_energy = find_counters()
        try:
            with EnergyMeter(counters) as meter, early_stop.stages(spec.early_stop):
                metrics, raw = engine.measure(spec.workload)
        except early_stop.StoppedEarly as e:  # after the first batch: its numbers, no quality pass
            times["workload"] = time.perf_counter() - t
            return _stopped(spec, e.reason, {"load_s": load_s, **e.metrics, **engine.memory()},
                            engine.info, e.raw, times)
        wl = spec.workload
        energy = energy_metrics(meter, measured_tokens(raw, wl.warmup * wl.max_tokens))
        metrics = {"load_s": load_s, **metrics, **engine.memory(), **energy}
        times["workload"] = time.perf_counter() - t
        why = early_stop.verdict(spec.early_stop, metrics, raw)  # the whole workload: skip quality?
        if why:
            return _stopped(spec, why, metrics, engine.info, raw, times)
        if spec.quality.enabled:
            t = time.perf_counter()
            metrics |= engine.quality(spec.quality)
            times["quality"] = time.perf_counter() - t
        return TrialResult(spec.number, "ok", metrics, info={
            **engine.info, "energy": meter.describe() if energy else no_energy
            or "no output tokens counted"}, samples=raw, times_s=times)
    except InfeasibleConfig as e:
        return TrialResult(spec.number, "infeasible", reason=str(e), info=engine.info, times_s=times)
    except MemoryError:
        return TrialResult(spec.number, "failed", reason="out of memory (MemoryError)", info=engine.info,
                           times_s=times)
    except Exception as e:  # noqa: BLE001 - every failure becomes a result with its reason
        traceback.print_exc()
        return TrialResult(spec.number, "failed", reason=f"{type(e).__name__}: {e}", info=engine.info,
                           times_s=times)
    finally:
        try:
            engine.stop()
        except Exception:  # noqa: BLE001
            traceback.print_exc()


def _stopped(spec: TrialSpec, reason: str, metrics: dict, info: dict, samples: dict,
             times: dict) -> TrialResult:
    """A trial stopped as soon as it could not win: its partial numbers, its samples and why."""
    return TrialResult(spec.number, "stopped", metrics, reason=reason, info=info, samples=samples,
                       times_s=times)


def main(argv: list[str] | None = None, guard: int | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = TrialSpec.from_json(Path(argv[0]).read_text())
    parent = os.getppid() if guard is None else guard
    threading.Thread(target=_watchdog, args=(spec.timeout_s, parent), daemon=True).start()
    result = execute(spec)
    write_atomic(argv[1], result.to_json())
    sys.stdout.flush()
    sys.stderr.flush()
    return 0


if __name__ == "__main__":
    # os._exit: skip interpreter teardown (llama.cpp / torch atexit hooks can hang).
    guard = os.environ.pop(GUARD_ENV, None)  # set by autotune.trial.guard; engines never see it
    code = main(guard=None if guard is None else int(guard))
    if guard is not None:  # in the trial's group (started by autotune.trial.guard)
        # The result is written: take the engine's leftovers (a child ignoring SIGTERM) with
        # us now, so none survives if the runner dies before its own kill_group (bench/soak.py).
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(code)
