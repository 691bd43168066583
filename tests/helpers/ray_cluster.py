"""Helpers for the Ray placement and cluster tests: configs, a real study run, record checks.

Importing this module makes Ray treat this machine as loopback-only
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: every Ray process, node and driver binds and
connects to 127.0.0.1) with token auth on, so it must be imported before ``ray``.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

# Ray reads these once, when first imported: if another test imported ray earlier, a head
# started by a test must match the driver's auth mode, and loopback-only may be off.
RAY_IMPORTED_EARLY = "ray" in sys.modules
HEAD_AUTH_MODE = ("disabled" if RAY_IMPORTED_EARLY and "RAY_AUTH_MODE" not in os.environ
                  else os.environ.get("RAY_AUTH_MODE", "token"))
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
# `ray start` turns token auth on (~/.ray/auth_token); a Python driver sends the token only
# in token mode
os.environ.setdefault("RAY_AUTH_MODE", "token")

from rich.console import Console  # noqa: E402

from autotune.config.compose import compose  # noqa: E402
from autotune.config.schema import Config  # noqa: E402
from autotune.config.schema import load_config  # noqa: E402
from autotune.config.validate import compile_space  # noqa: E402
from autotune.engines.fake import read_records  # noqa: E402
from autotune.search.space import Space  # noqa: E402
from tests.helpers.procs import process_alive  # noqa: E402

RAY_INIT = {"include_dashboard": False, "log_to_driver": False, "logging_level": "WARNING"}


def loopback_only() -> bool:
    """True if this process's Ray uses 127.0.0.1 for itself (see the module docstring)."""
    from ray._private import ray_constants

    return not ray_constants.ENABLE_RAY_CLUSTER


def fake_config(tmp: Path, overrides: list[str] = (), space: dict | None = None,
                enqueue: list[dict] | None = None) -> tuple[Config, Space]:
    """The ``fake_gpus`` preset with its study, records and MLflow off, under ``tmp``."""
    data = compose(["conf=fake_gpus", f"study.dir={tmp / 'study'}", "tracking.enabled=false",
                    f"engine.settings.record_dir={tmp / 'records'}", "select.top_k=0",
                    "study.sampler=random", *overrides])
    if space:
        data["space"].update(space)
    if enqueue:
        data["study"]["enqueue"] = enqueue
    cfg = load_config(data)
    return cfg, compile_space(cfg)


def run_study(cfg: Config, space: Space) -> tuple[dict[str, Any], str]:
    """Run the real driver on the Ray already initialised; (summary, console output)."""
    from autotune.output.report import Reporter
    from autotune.run.driver import Driver
    from autotune.run.placement import Placement

    out = io.StringIO()
    placement = Placement(cfg.ray)
    try:
        summary = Driver(cfg, space, placement, None, Reporter(cfg, Console(file=out))).run()
    finally:
        placement.shutdown()
    return summary.to_dict(), out.getvalue()


def study_records(cfg: Config):
    """(finished trial count, records by number) read back from the Optuna storage."""
    import optuna

    from autotune.record.optuna_study import n_finished
    from autotune.record.optuna_study import records

    study = optuna.load_study(study_name=cfg.study.name, storage=cfg.storage_url)
    return n_finished(study), {r.number: r for r in records(study)}


def trial_events(cfg: Config) -> dict[int, dict[str, dict]]:
    """Per trial number, its record events by kind (start, end, crash)."""
    out: dict[int, dict[str, dict]] = {}
    for ev in read_records(cfg.engine.settings["record_dir"]):
        out.setdefault(int(ev["trial"]), {})[ev["event"]] = ev
    return out


def wait_gone(pids: list[int], timeout_s: float = 15.0, poll_s: float = 0.2) -> list[int]:
    """Wait until none of ``pids`` runs; the survivors after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in pids if process_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(poll_s)
        alive = [p for p in alive if process_alive(p)]
    return alive


def gpu_overlaps(events: dict[int, dict[str, dict]], ends: dict[int, float] | None = None) -> list:
    """Pairs of trials that ran at the same time on the same node and shared a GPU index.

    A trial's interval is [start, end]; ``ends`` supplies end times of trials that never
    wrote an ``end`` event (killed). Nodes are told apart by their raylet's pid.
    """
    spans = []
    for n, ev in events.items():
        start = ev.get("start")
        if not start:
            continue
        end = (ev.get("end") or ev.get("crash") or {}).get("time") or (ends or {}).get(n)
        devices = {d for d in (start["cuda_visible_devices"] or "").split(",") if d}
        spans.append((n, start["raylet_pid"], start["time"], end or float("inf"), devices))
    bad = []
    for i, a in enumerate(spans):
        for b in spans[i + 1:]:
            if a[1] == b[1] and a[2] < b[3] and b[2] < a[3] and a[4] & b[4]:
                bad.append((a[0], b[0], sorted(a[4] & b[4])))
    return bad


def max_concurrent(events: dict[int, dict[str, dict]]) -> int:
    """The most trials that ran at once (from start/end events)."""
    marks = []
    for ev in events.values():
        if "start" in ev and "end" in ev:
            marks += [(ev["start"]["time"], 1), (ev["end"]["time"], -1)]
    best = cur = 0
    for _, d in sorted(marks, key=lambda m: (m[0], m[1])):
        cur += d
        best = max(best, cur)
    return best


class WhenStarted(threading.Thread):
    """Calls ``action(event)`` once the first trial matching ``pred`` writes its start event."""

    def __init__(self, record_dir: str, pred, action, timeout_s: float = 120.0) -> None:
        super().__init__(daemon=True)
        self.record_dir, self.pred, self.action, self.timeout_s = record_dir, pred, action, timeout_s
        self.event: dict | None = None
        self.fired_at: float | None = None

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            for ev in read_records(self.record_dir):
                if ev["event"] == "start" and self.pred(ev):
                    time.sleep(0.5)  # mid-trial: let it get going
                    self.event = ev
                    self.action(ev)
                    self.fired_at = time.time()
                    return
            time.sleep(0.1)
