"""A fake GPU engine: a small real implementation that drives the real driver without a GPU.

It stands in for GPU-only engines (vLLM, ExLlamaV2) in placement, cluster and fault tests
and in ``bench/parallel.py``. Each trial reserves ``gpus`` whole GPUs (fractional only with
``settings.share_gpus: true``), ``cpus`` CPUs and any custom Ray resources, then "serves"
requests by sleeping: decode speed is a smooth, deterministic function of the knobs
``x``, ``y`` and ``gpus`` (see :func:`model_speed`), so a sampler has something to optimise.

Knobs: ``x``, ``y`` (floats in [0, 1]), ``gpus``, ``cpus``, ``duration_s`` (simulated model
load, seconds), ``gpu_memory_gb`` (per GPU; infeasible if it exceeds a device in
``settings.gpus``), ``resource`` (a custom Ray resource name the trial needs one unit of,
e.g. ``gpu_5090``), ``burn_cpu_s`` (CPU seconds the worker spends in a busy loop in
``start``: a CPU-bound fake engine for CPU accounting tests; ``info["cpu_s"]`` is then the
worker's CPU time after it) and the fault knobs ``hang`` (sleep forever: the runner's
timeout kills the group), ``oom`` (MemoryError), ``crash`` (``os._exit(1)`` at the first
request, after the load), ``nan`` (decode speed reported as NaN), ``garbage`` (answers
without token timings: the objective metrics are missing) and ``stubborn`` (starts a child
that ignores SIGTERM, so only the runner's SIGKILL of the group ends it). Precedence: hang,
oom, crash, garbage, nan.

Settings: ``gpus`` (list of ``{name, memory_gb}``: the fake devices, indexed like
``CUDA_VISIBLE_DEVICES``), ``resources`` (custom Ray resources every trial needs),
``share_gpus`` (allow fractional ``gpus``), ``record_dir`` (each trial appends JSON lines
``start`` / ``end`` with pid, pgid, ppid, hostname, Ray raylet pid, CUDA_VISIBLE_DEVICES and
wall-clock times to ``record_dir/records.jsonl``, so tests can assert placement from inside
every trial). ``logprobs`` is unsupported: configs using this engine disable quality.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from autotune.engines.base import Engine
from autotune.engines.base import EngineSettings
from autotune.engines.base import Knob
from autotune.engines.base import Resources
from autotune.errors import ConfigError
from autotune.errors import InfeasibleConfig
from autotune.errors import RequestRejected
from autotune.errors import Unsupported
from autotune.measure.types import Generation

RECORD_FILE = "records.jsonl"
CHUNK_TOKENS = 4


def model_speed(x: float, y: float, gpus: float) -> float:
    """Decode tok/s of the fake model: one smooth peak at x=0.7, y=0.3, sub-linear in GPUs."""
    peak = math.exp(-((x - 0.7) ** 2 + (y - 0.3) ** 2) / 0.08)
    return (200.0 + 800.0 * peak) * max(gpus, 0.25) ** 0.7


def model_ttft_s(x: float, prompt_tokens: int) -> float:
    """Time to first token: grows with x (the trade-off against speed) and prompt length."""
    return 0.004 + 0.02 * x + prompt_tokens * 2e-5


def append_record(record_dir: str | Path, event: dict[str, Any]) -> None:
    """Append one JSON line (a single O_APPEND write, so concurrent trials never interleave)."""
    path = Path(record_dir) / RECORD_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(event, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_records(record_dir: str | Path) -> list[dict[str, Any]]:
    """Every event appended under ``record_dir`` (empty if none)."""
    path = Path(record_dir) / RECORD_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class FakeSettings(EngineSettings):
    """``engine.settings`` of the fake engine (``gpus``: the fake devices)."""

    resources: dict = field(default_factory=dict)  # custom Ray resources every trial needs
    share_gpus: bool = False  # allow fractional ``gpus``
    record_dir: str | None = None  # append start/end JSON lines to record_dir/records.jsonl


class FakeEngine(Engine):
    """Sleeps like a GPU engine would compute; see the module docstring for knobs/settings."""

    name = "fake"
    predictor = "autotune.engines.predict:predict_fake"  # gpu_memory_gb on settings.gpus
    settings_schema = FakeSettings
    supports_quality = False  # no logits
    uses_variants = False  # no model files
    knobs = {
        "x": Knob("float", low=0.0, high=1.0, doc="first tuning knob (speed peaks at 0.7)"),
        "y": Knob("float", low=0.0, high=1.0, doc="second tuning knob (speed peaks at 0.3)"),
        "gpus": Knob("float", low=0.0, high=64.0, doc="GPUs the trial reserves"),
        "cpus": Knob("float", low=0.0, high=512.0, doc="CPUs the trial reserves"),
        "duration_s": Knob("float", low=0.0, high=3600.0, doc="simulated model load (s)"),
        "burn_cpu_s": Knob("float", low=0.0, high=3600.0, doc="CPU seconds of busy loop in start()"),
        "gpu_memory_gb": Knob("float", low=0.0, high=1024.0, doc="memory needed per GPU"),
        "resource": Knob("str", doc="custom Ray resource the trial needs 1 of ('' = none)"),
        "crash": Knob("bool", doc="os._exit(1) at the first request"),
        "hang": Knob("bool", doc="sleep forever in start()"),
        "oom": Knob("bool", doc="raise MemoryError in start()"),
        "nan": Knob("bool", doc="report NaN decode speed"),
        "garbage": Knob("bool", doc="answer with garbage: no token timings, undecodable text"),
        "stubborn": Knob("bool", doc="start a child process that ignores SIGTERM"),
        # serving limits (a known saturation point for the load search), 0 = off
        "max_batch": Knob("int", low=0, high=4096, doc="requests served at once; more wait in a queue"),
        "reject_over": Knob("int", low=0, high=4096, doc="HTTP 429 when more than this many are in flight"),
        "oom_over": Knob("int", low=0, high=4096, doc="MemoryError when more than this many are in flight"),
    }

    # ---- driver side -----------------------------------------------------------------
    @classmethod
    def default_params(cls, settings: dict, variants: dict) -> dict[str, Any]:
        return {"x": 0.5, "y": 0.5, "gpus": 1, "cpus": 1, "duration_s": 0.0, "burn_cpu_s": 0.0,
                "gpu_memory_gb": 0.0, "resource": "", "crash": False, "hang": False,
                "oom": False, "nan": False, "garbage": False, "stubborn": False,
                "max_batch": 0, "reject_over": 0, "oom_over": 0}

    @classmethod
    def validate_more(cls, settings: dict, variants: dict, path: str = "engine") -> None:
        gpus = settings.get("gpus") or []
        for i, g in enumerate(gpus):
            if not isinstance(g, dict) or not isinstance(g.get("memory_gb", 0), (int, float)):
                raise ConfigError(f"{path}.settings.gpus[{i}]", g, "expected {name, memory_gb}")
        res = settings.get("resources") or {}
        if not isinstance(res, dict) or not all(isinstance(v, (int, float)) for v in res.values()):
            raise ConfigError(f"{path}.settings.resources", res, "expected {name: amount}")

    @classmethod
    def preflight(cls, settings: dict, build: bool = True) -> list[str]:
        """The fake GPUs are Ray resources (``ray.num_gpus``), not devices: nothing to check."""
        return []

    @classmethod
    def resources(cls, params: dict, settings: dict) -> Resources:
        p = cls.full_params(params, settings)
        custom = {str(k): float(v) for k, v in cls.typed_settings(settings).resources.items()}
        if p["resource"]:
            custom[p["resource"]] = custom.get(p["resource"], 0.0) + 1.0
        return Resources(num_cpus=float(p["cpus"]), num_gpus=float(p["gpus"]), custom=custom)

    @classmethod
    def engine_reasons(cls, params: dict, settings: dict) -> list[str]:
        # settings.gpus is the device list (a setting), not the knob gpus
        p = cls.full_params(params, settings)
        s = cls.typed_settings(settings)
        reasons = []
        gpus = float(p["gpus"])
        if gpus != int(gpus) and not s.share_gpus:
            reasons.append(f"gpus={gpus:g} is fractional: two trials would share a GPU; "
                           "set engine.settings.share_gpus: true to allow it")
        if gpus > 1 and gpus != int(gpus):
            reasons.append(f"gpus={gpus:g}: more than one GPU must be a whole number")
        devices = s.gpus
        mem = float(p["gpu_memory_gb"])
        if devices and mem > max(float(g.get("memory_gb", math.inf)) for g in devices):
            reasons.append(f"gpu_memory_gb={mem:g} exceeds every GPU in engine.settings.gpus")
        if devices and gpus > len(devices):
            reasons.append(f"gpus={gpus:g} but engine.settings.gpus lists {len(devices)}")
        return reasons

    # ---- worker side -------------------------------------------------------------------
    def _p(self, key: str) -> Any:
        return self.full_params(self.params, self.settings)[key]

    def _record(self, event: str, **extra: Any) -> None:
        rec_dir = self.opts.record_dir
        if not rec_dir:
            return
        append_record(rec_dir, {
            "event": event, "trial": self.workdir.name, "time": time.time(), "pid": os.getpid(),
            "pgid": os.getpgrp(), "ppid": os.getppid(), "host": platform.node(),
            "raylet_pid": os.environ.get("RAY_RAYLET_PID"),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "gpus": self._p("gpus"), "params": self.params, **extra,
        })

    def assigned_gpus(self) -> list[int]:
        """Device indices from CUDA_VISIBLE_DEVICES (Ray sets it for a GPU task)."""
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        return [int(i) for i in cvd.split(",") if i.strip().isdigit()]

    def start(self) -> None:
        self.started = time.time()
        self._record("start")
        self.info.update(cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                         pid=os.getpid())
        if self._p("hang"):
            while True:
                time.sleep(3600)
        if self._p("oom"):
            raise MemoryError("fake engine: simulated out of memory")
        devices = self.opts.gpus
        mem = float(self._p("gpu_memory_gb"))
        for i in self.assigned_gpus():
            if i < len(devices) and mem > float(devices[i].get("memory_gb", math.inf)):
                raise InfeasibleConfig(
                    f"needs {mem:g} GB per GPU; GPU {i} ({devices[i].get('name', 'GPU')}) "
                    f"has {devices[i]['memory_gb']} GB")
        if self._p("stubborn"):  # stays in the trial's process group; only SIGKILL stops it
            code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"
            child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
            self._record("child", child_pid=child.pid)
        if self._p("burn_cpu_s"):  # the fake's CPU-bound load: the worker's own CPU, no sleep
            end = time.process_time() + float(self._p("burn_cpu_s"))
            while time.process_time() < end:
                pass
            self.info["cpu_s"] = time.process_time()
        time.sleep(float(self._p("duration_s")))
        self.requests = 0
        self._slots = threading.BoundedSemaphore(self._p("max_batch")) if self._p("max_batch") else None
        self._in_flight = 0
        self._flight_lock = threading.Lock()

    def generate(self, prompt: str, max_tokens: int, ignore_eos: bool = True) -> Generation:
        if self._p("crash"):
            self._record("crash")
            os._exit(1)
        self.requests += 1
        if self._p("garbage"):
            return Generation(0, 0, [], 0.0, text="\ufffd\x00garbage")
        t0 = time.perf_counter()  # a request waiting for a batch slot waits in its TTFT
        with self._flight_lock:
            self._in_flight += 1
            busy = self._in_flight
        try:
            if self._p("reject_over") and busy > self._p("reject_over"):
                raise RequestRejected(429, f"fake engine: {busy} requests in flight")
            if self._p("oom_over") and busy > self._p("oom_over"):
                raise MemoryError(f"fake engine: out of memory with {busy} requests in flight")
            with self._slots or contextlib.nullcontext():
                return self._serve(prompt, max_tokens, t0)
        finally:
            with self._flight_lock:
                self._in_flight -= 1

    def _serve(self, prompt: str, max_tokens: int, t0: float) -> Generation:
        prompt_tokens = len(prompt.split())
        speed = model_speed(float(self._p("x")), float(self._p("y")), float(self._p("gpus")))
        time.sleep(model_ttft_s(float(self._p("x")), prompt_tokens))
        chunks = [time.perf_counter() - t0]
        done = 1
        while done < max_tokens:
            step = min(CHUNK_TOKENS, max_tokens - done)
            time.sleep(step / speed)
            chunks.append(time.perf_counter() - t0)
            done += step
        return Generation(prompt_tokens, max_tokens, chunks, time.perf_counter() - t0)

    def measure(self, workload: dict) -> tuple[dict[str, float], dict]:
        metrics, raw = super().measure(workload)
        if self._p("nan"):
            metrics["decode_tps"] = math.nan
        return metrics, raw

    def memory(self) -> dict[str, float]:
        mem = float(self._p("gpu_memory_gb"))
        return {"vram_peak_gb": mem * len(self.assigned_gpus())} if mem else {}

    def logprobs(self, text: str, n_tokens: int):
        raise Unsupported("the fake engine has no logits: set quality.enabled: false")

    def stop(self) -> None:
        if hasattr(self, "started"):
            self._record("end")
