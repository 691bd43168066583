"""A custom engine driven by a command line: ``engine.kind: command``.

The command measures itself. Per trial, autotune formats the argv template in
``engine.settings.argv`` with the trial's parameters, runs it (never through a shell), and
reads the metrics from the last stdout line that parses as a JSON object::

    engine:
      kind: command
      settings:
        argv: ["{python}", "bench/engines/toy_streamer.py",
               "--draft-k", "{draft_k}", "--skip-threshold", "{skip_threshold}"]
        knobs:
          draft_k: {type: int, low: 0, high: 16}
          skip_threshold: {type: float, low: 0.5, high: 1.0}
        defaults: {draft_k: 0, skip_threshold: 1.0}
        timeout_s: 120

Contract:

- Each argv item is formatted on its own; ``{name}`` may name a declared knob, a key of
  ``settings.vars``, or a built-in (:data:`BUILTINS`). An item may also be a list (a group
  such as ``["--draft-k", "{draft_k}"]``) that is left out whole when a knob it names has
  no value. Values become literal argv items: bools as ``true``/``false``, lists as ``a,b``.
- A knob missing from the trial's parameters (not searched, or inactive under ``when``)
  takes its value from ``settings.defaults``, which is also the baseline (trial 0).
- The resolved knob values arrive as JSON in ``AUTOTUNE_PARAMS``, the workload in
  ``AUTOTUNE_WORKLOAD``; ``settings.env`` adds variables and ``settings.cwd`` sets the
  directory (relative to where autotune started).
- A non-zero exit, a missing metrics line or a run past ``settings.timeout_s`` is a failed
  trial whose reason carries the exit status and the tail of stderr.

The command runs in the trial worker's process group, so the trial runner's kill of the
group reaches it and anything it started.
"""

from __future__ import annotations

import json
import math
import os
import resource
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import ClassVar

from autotune._files import tail
from autotune._files import write_atomic
from autotune.engines._argv import render_argv
from autotune.engines.base import Engine
from autotune.engines.base import EngineSettings
from autotune.engines.base import Knob
from autotune.engines.base import Resources
from autotune.engines.predict import validate_command_predict
from autotune.errors import CommandFailed
from autotune.errors import ConfigError
from autotune.errors import unknown_name
from autotune.measure.spec import WorkloadSpec

VARIANT_KEYS = ("path", "bpw", "description")
RESOURCE_KEYS = ("num_cpus", "num_gpus", "custom")
BUILTINS = {
    "python": "the Python interpreter running autotune",
    "workdir": "the trial's own directory",
    "max_tokens": "workload.max_tokens",
    "repeats": "workload.repeats",
    "warmup": "workload.warmup",
    "concurrency": "workload.concurrency",
    "prompts": "workload.prompts",
    "model_path": "engine.variants[model].path",
}
DEFAULT_TIMEOUT_S = 120.0
TAIL_CHARS = 600


__all__ = ["CommandEngine", "CommandFailed", "CommandSettings", "parse_metrics"]


@dataclass(frozen=True)
class CommandSettings(EngineSettings):
    """``engine.settings`` of the command engine (see the module docstring)."""

    argv: list = field(default_factory=list)  # the argv template (never a shell string)
    knobs: dict = field(default_factory=dict)  # name -> {type, choices, low, high, doc, spelling}
    defaults: dict = field(default_factory=dict)  # the command's own defaults (trial 0)
    timeout_s: float = DEFAULT_TIMEOUT_S  # the command is killed after this long
    env: dict = field(default_factory=dict)  # extra environment variables
    cwd: str | None = None  # working directory (None: where autotune started)
    vars: dict = field(default_factory=dict)  # constants usable as {name} in argv
    resources: dict = field(default_factory=dict)  # {num_cpus, num_gpus, custom}
    predict: dict | None = None  # need_gb / have_gb / decode_tps_upper (autotune/engines/predict.py)
    quality_knobs: list | None = None  # the knobs that decide the command's quality metrics


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)




class CommandEngine(Engine):
    """Runs ``settings.argv`` once per trial; the command prints its own metrics as JSON."""

    name = "command"
    predictor = "autotune.engines.predict:predict_command"  # settings.predict (docs/predict.md)
    no_reads_hint: ClassVar[str] = " (engine.settings.predict declares no bytes)"
    settings_schema = CommandSettings
    supports_quality: ClassVar[bool] = False  # the command measures quality itself, if at all
    quality_hint: ClassVar[str] = " (the command may print ppl_delta_pct itself)"
    uses_variants: ClassVar[bool] = False  # variants are {path, bpw, description}: checked here
    _rss_mb: float = 0.0  # peak RSS of the command, once it ran

    # ---- driver side: pure ----------------------------------------------------------
    @classmethod
    def knobs_for(cls, settings: dict) -> dict[str, Knob]:
        knobs = settings.get("knobs") or {}
        if not isinstance(knobs, dict):
            return {}
        return dict(_parsed_knobs(repr(knobs), knobs))

    @classmethod
    def default_params(cls, settings: dict, variants: dict) -> dict[str, Any]:
        return dict(cls.typed_settings(settings).defaults)

    @classmethod
    def quality_knobs_for(cls, settings: dict) -> tuple[str, ...] | None:
        """``settings.quality_knobs``: what the user says decides the quality metrics the
        command prints (ppl_delta_pct...); a proposal whose values of them were measured and
        broke a quality bound is refused before launch (autotune.run.quality_memo)."""
        knobs = settings.get("quality_knobs")
        return tuple(knobs) if isinstance(knobs, list) else None

    @classmethod
    def allowed_placeholders(cls, settings: dict, variants: dict) -> list[str]:
        names = set(cls.knobs_for(settings)) | set(settings.get("vars") or {}) | set(BUILTINS)
        if not variants:
            names.discard("model_path")
        return sorted(names)

    @classmethod
    def own_timeout_s(cls, settings: dict) -> float | None:
        return settings.get("timeout_s")

    @classmethod
    def validate_more(cls, settings: dict, variants: dict, path: str = "engine") -> None:
        p = f"{path}.settings"
        knobs_raw = settings.get("knobs")
        if not isinstance(knobs_raw, dict) or not knobs_raw:
            raise ConfigError(f"{p}.knobs", knobs_raw, "expected a mapping of knob name -> "
                              "{type, choices, low, high}")
        for name in knobs_raw:
            if not str(name).isidentifier() or name in BUILTINS:
                raise ConfigError(f"{p}.knobs.{name}", name, "a knob name is an identifier, not "
                                  "one of the built-in placeholders " + ", ".join(BUILTINS))
        knobs = cls.knobs_for(settings)
        for name, value in (settings.get("defaults") or {}).items():
            if name not in knobs:
                raise unknown_name(f"{p}.defaults.{name}", name, knobs, "declared knob")
            if not knobs[name].accepts(value):
                raise ConfigError(f"{p}.defaults.{name}", value,
                                  f"knob {name} takes {knobs[name].allowed()}")
        for name, value in (settings.get("env") or {}).items():
            if not isinstance(value, str) and not _is_number(value):
                raise ConfigError(f"{p}.env.{name}", value, "expected a string or a number")
        for name in settings.get("vars") or {}:
            if name in knobs or name in BUILTINS:
                raise ConfigError(f"{p}.vars.{name}", name, "may not shadow a knob or a built-in")
        timeout = settings.get("timeout_s", DEFAULT_TIMEOUT_S)
        if not _is_number(timeout) or timeout <= 0:
            raise ConfigError(f"{p}.timeout_s", timeout, "expected a number of seconds > 0")
        for key, value in (settings.get("resources") or {}).items():
            if key not in RESOURCE_KEYS:
                raise unknown_name(f"{p}.resources.{key}", key, RESOURCE_KEYS, "key")
            if key != "custom" and (not _is_number(value) or value < 0):
                raise ConfigError(f"{p}.resources.{key}", value, "expected a number >= 0")
        quality = settings.get("quality_knobs")
        if quality is not None and (not isinstance(quality, list) or not quality):
            raise ConfigError(f"{p}.quality_knobs", quality, "expected a list of the knobs that decide the "
                              "quality metrics the command prints, e.g. [quant, kv_type]")
        for name in quality or []:
            if name not in knobs:
                raise unknown_name(f"{p}.quality_knobs", name, knobs, "declared knob")
        cls._validate_argv(settings, variants, p)
        validate_command_predict(settings.get("predict"), sorted(set(knobs) | set(settings.get("vars") or {})),
                                 f"{p}.predict")
        for name, v in (variants or {}).items():
            if not isinstance(v, dict) or not all(k in VARIANT_KEYS for k in v):
                raise ConfigError(f"{path}.variants.{name}", v,
                                  "expected {path: ..., bpw: ..., description: ...}")

    @classmethod
    def _validate_argv(cls, settings: dict, variants: dict, p: str) -> None:
        argv = settings.get("argv")
        if not isinstance(argv, list) or not argv:
            raise ConfigError(f"{p}.argv", argv, 'expected a list like ["./engine", "--k", "{k}"]')
        render_argv(argv, dict.fromkeys(cls.allowed_placeholders(settings, variants)),
                    f"{p}.argv")

    @classmethod
    def resources(cls, params: dict, settings: dict) -> Resources:
        res = cls.typed_settings(settings).resources
        return Resources(
            num_cpus=float(res.get("num_cpus", 1)),
            num_gpus=float(res.get("num_gpus", 0)),
            custom=dict(res.get("custom") or {}),
        )

    @classmethod
    def resolve(cls, params: dict, settings: dict) -> dict[str, Any]:
        """Every declared knob's value for this trial: the trial's parameter, else the default."""
        full = cls.full_params(params, settings)
        return {k: full[k] for k in cls.typed_settings(settings).knobs if full.get(k) is not None}

    @staticmethod
    def _builtins(workdir: str, workload: dict) -> dict[str, Any]:
        names = ("max_tokens", "repeats", "warmup", "concurrency", "prompts")
        return {
            "python": sys.executable,
            "workdir": workdir,
            **{k: workload.get(k) for k in names},
        }

    @classmethod
    def build_argv(cls, params: dict, settings: dict, variants: dict, extra: dict) -> list[str]:
        """The argv for ``params`` (pure; ``extra`` holds the built-in placeholders)."""
        s = cls.typed_settings(settings)
        values = {**dict.fromkeys(s.knobs), "model_path": None,
                  **s.vars, **extra, **cls.resolve(params, settings)}
        model = values.get("model")
        if variants and model in variants and "path" in variants[model]:
            values["model_path"] = variants[model]["path"]
        return render_argv(s.argv, values)

    @classmethod
    def describe_launch(
        cls, params: dict, settings: dict, variants: dict, workload: dict | None = None
    ) -> str:
        """The command line a trial with ``params`` runs (for --dry-run)."""
        argv = cls.build_argv(
            params, settings, variants, cls._builtins("TRIAL_DIR", workload or {})
        )
        cwd = cls.typed_settings(settings).cwd
        where = f" (in {cwd})" if cwd else ""
        return shlex.join(argv) + where

    @classmethod
    def export(cls, params: dict, settings: dict, variants: dict, out_dir: Path) -> list[Path]:
        """``command.json``: the winner's argv and environment, ready to run."""
        argv = cls.build_argv(params, settings, variants, cls._builtins(".", {}))
        s = cls.typed_settings(settings)
        path = Path(out_dir) / "command.json"
        write_atomic(
            path,
            json.dumps(
                {
                    "argv": argv,
                    "cwd": s.cwd,
                    "env": {
                        **s.env,
                        "AUTOTUNE_PARAMS": json.dumps(cls.resolve(params, settings)),
                    },
                },
                indent=2,
            )
            + "\n",
        )
        return [path]

    # ---- worker side ------------------------------------------------------------------
    def start(self) -> None:
        """Nothing to load: the command starts in :meth:`measure`."""
        self._rss_mb = 0.0

    def measure(self, workload: WorkloadSpec | dict) -> tuple[dict[str, float], dict]:
        """Run the command once and parse its metrics line; raise CommandFailed otherwise."""
        if isinstance(workload, WorkloadSpec):
            workload = workload.to_dict()
        argv = self.build_argv(
            self.params, self.settings, self.variants, self._builtins(str(self.workdir), workload)
        )
        env = {
            **os.environ,
            **{str(k): str(v) for k, v in self.opts.env.items()},
            "AUTOTUNE_PARAMS": json.dumps(self.resolve(self.params, self.settings)),
            "AUTOTUNE_WORKLOAD": json.dumps(workload),
        }
        cwd = self.opts.cwd or None
        timeout = float(self.opts.timeout_s)
        self.workdir.mkdir(parents=True, exist_ok=True)
        out_path, err_path = self.workdir / "command.stdout", self.workdir / "command.stderr"
        self.info["argv"] = argv
        print("command:", json.dumps(argv), flush=True)
        t0 = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(
                    argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=cwd
                )
            except OSError as e:
                raise CommandFailed(f"cannot start {argv[0]!r}: {e.strerror or e}") from None
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise CommandFailed(
                    f"command timed out after {timeout:g} s and was killed; "
                    f"stderr: {_tail(err_path)}"
                ) from None
        self.info["command_s"] = round(time.monotonic() - t0, 3)
        self._rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
        stderr = _tail(err_path)
        if stderr:
            print("command stderr:", stderr, flush=True)
        if rc != 0:
            raise CommandFailed(f"command exited with status {rc}; stderr: {stderr or '(empty)'}")
        metrics = parse_metrics(out_path.read_text(errors="replace"))
        if metrics is None:
            raise CommandFailed(
                "command printed no JSON object line on stdout (exit status 0); "
                f"stdout: {_tail(out_path)}; stderr: {stderr or '(empty)'}"
            )
        numeric = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }
        self.info["command_extra"] = {k: v for k, v in metrics.items() if k not in numeric}
        return numeric, {}

    def memory(self) -> dict[str, float]:
        """Peak RSS of the command (the largest child this worker waited for)."""
        return {"peak_rss_mb": self._rss_mb} if self._rss_mb else {}


def parse_metrics(stdout: str) -> dict | None:
    """The last line of ``stdout`` that parses as a JSON object, or None."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict):
                return data
    return None


def _tail(path: Path) -> str:
    return tail(path, sep=" | ")[-TAIL_CHARS:]


_PARSED: dict[str, tuple[tuple[str, Knob], ...]] = {}


def _parsed_knobs(key: str, knobs: dict) -> tuple[tuple[str, Knob], ...]:
    """The declared knobs parsed once per declaration (``key``: its repr): the engine's check runs
    for every configuration of a pool (tens of thousands), and parsing them each time was a
    quarter of a simulated study's time (bench/surfaces/fast.py, profiled)."""
    if key not in _PARSED:
        if len(_PARSED) > 64:
            _PARSED.clear()
        _PARSED[key] = tuple((n, Knob.parse(n, s, f"engine.settings.knobs.{n}")) for n, s in knobs.items())
    return _PARSED[key]
