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
import string
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from typing import ClassVar

from autotune.engines.base import Engine
from autotune.engines.base import Knob
from autotune.engines.base import Resources
from autotune.errors import ConfigError
from autotune.errors import unknown_name

SETTINGS = ("argv", "knobs", "defaults", "timeout_s", "env", "cwd", "vars", "resources")
KNOB_TYPES = ("int", "float", "bool", "str", "list")
KNOB_KEYS = ("type", "choices", "low", "high", "doc", "spelling")
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


class CommandFailed(Exception):
    """The command exited non-zero, printed no metrics line, or ran past its timeout."""


def placeholders(item: str) -> list[tuple[str, str]]:
    """``(field, spec)`` of each ``{field:spec}`` in ``item`` (ValueError if malformed)."""
    return [(f, s or "") for _, f, s, _ in string.Formatter().parse(item) if f is not None]


def format_value(value: Any) -> str:
    """The literal argv text of a value: ``true``/``false``, lists as ``a,b``, mappings as JSON
    (the same rendering as the ``openai_server`` engine's templates)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(format_value(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _knob(name: str, spec: Any, path: str) -> Knob:
    if not isinstance(spec, dict):
        raise ConfigError(path, spec, "expected {type: int|float|bool|str|list, choices, ...}")
    for key in spec:
        if key not in KNOB_KEYS:
            raise unknown_name(f"{path}.{key}", key, KNOB_KEYS, "knob key")
    kind = spec.get("type")
    if kind not in KNOB_TYPES:
        raise unknown_name(f"{path}.type", kind, KNOB_TYPES, "knob type")
    choices = spec.get("choices")
    if choices is not None and (not isinstance(choices, list) or not choices):
        raise ConfigError(f"{path}.choices", choices, "expected a non-empty list")
    for key in ("low", "high"):
        v = spec.get(key)
        if v is not None and (kind not in ("int", "float") or not _is_number(v)):
            raise ConfigError(f"{path}.{key}", v, "low/high are numbers, for int and float knobs")
    for i, c in enumerate(choices or []):
        if not Knob(kind).accepts(c):
            raise ConfigError(f"{path}.choices[{i}]", c, f"a {kind} knob's choices are {kind}s")
    return Knob(kind, tuple(choices) if choices else None, spec.get("low"), spec.get("high"),
                spelling=str(spec.get("spelling", name)), doc=str(spec.get("doc", "")))


class CommandEngine(Engine):
    """Runs ``settings.argv`` once per trial; the command prints its own metrics as JSON."""

    name = "command"
    supports_quality: ClassVar[bool] = False  # the command measures quality itself, if at all

    # ---- driver side: pure ----------------------------------------------------------
    @classmethod
    def knobs_for(cls, settings: dict) -> dict[str, Knob]:
        knobs = settings.get("knobs") or {}
        if not isinstance(knobs, dict):
            return {}
        return {n: _knob(n, s, f"engine.settings.knobs.{n}") for n, s in knobs.items()}

    @classmethod
    def default_params(cls, settings: dict, variants: dict) -> dict[str, Any]:
        return dict(settings.get("defaults") or {})

    @classmethod
    def allowed_placeholders(cls, settings: dict, variants: dict) -> list[str]:
        names = set(cls.knobs_for(settings)) | set(settings.get("vars") or {}) | set(BUILTINS)
        if not variants:
            names.discard("model_path")
        return sorted(names)

    @classmethod
    def validate_settings(cls, settings: dict, variants: dict, path: str = "engine") -> None:
        p = f"{path}.settings"
        for key in settings:
            if key not in SETTINGS:
                raise unknown_name(f"{p}.{key}", key, SETTINGS, "setting of the command engine")
        knobs_raw = settings.get("knobs")
        if not isinstance(knobs_raw, dict) or not knobs_raw:
            raise ConfigError(f"{p}.knobs", knobs_raw, "expected a mapping of knob name -> "
                              "{type, choices, low, high}")
        for name in knobs_raw:
            if not str(name).isidentifier() or name in BUILTINS:
                raise ConfigError(f"{p}.knobs.{name}", name, "a knob name is an identifier, not "
                                  "one of the built-in placeholders " + ", ".join(BUILTINS))
        knobs = cls.knobs_for(settings)
        for key in ("vars", "env", "defaults", "resources"):
            if not isinstance(settings.get(key) or {}, dict):
                raise ConfigError(f"{p}.{key}", settings[key], "expected a mapping")
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
        if settings.get("cwd") is not None and not isinstance(settings["cwd"], str):
            raise ConfigError(f"{p}.cwd", settings["cwd"], "expected a directory path")
        for key, value in (settings.get("resources") or {}).items():
            if key not in RESOURCE_KEYS:
                raise unknown_name(f"{p}.resources.{key}", key, RESOURCE_KEYS, "key")
            if key != "custom" and (not _is_number(value) or value < 0):
                raise ConfigError(f"{p}.resources.{key}", value, "expected a number >= 0")
        cls._validate_argv(settings, variants, p)
        for name, v in (variants or {}).items():
            if not isinstance(v, dict) or not all(k in VARIANT_KEYS for k in v):
                raise ConfigError(f"{path}.variants.{name}", v,
                                  "expected {path: ..., bpw: ..., description: ...}")

    @classmethod
    def _validate_argv(cls, settings: dict, variants: dict, p: str) -> None:
        argv = settings.get("argv")
        if not isinstance(argv, list) or not argv:
            raise ConfigError(f"{p}.argv", argv, 'expected a list like ["./engine", "--k", "{k}"]')
        allowed = cls.allowed_placeholders(settings, variants)
        for i, item in enumerate(argv):
            group = item if isinstance(item, list) else [item]
            if isinstance(item, list) and not item:
                raise ConfigError(f"{p}.argv[{i}]", item, "a group is a non-empty list of strings")
            for j, part in enumerate(group):
                ip = f"{p}.argv[{i}]" + (f"[{j}]" if isinstance(item, list) else "")
                if not isinstance(part, str) and not _is_number(part):
                    raise ConfigError(ip, part, "expected a string (or a group: a list of them)")
                try:
                    fields = placeholders(str(part))
                except ValueError as e:
                    raise ConfigError(ip, part, f"malformed placeholder ({e}); write {{{{ for a "
                                      "brace") from None
                for field, _spec in fields:
                    if field not in allowed:
                        raise unknown_name(ip, f"{{{field}}}", [f"{{{a}}}" for a in allowed],
                                           "placeholder")

    @classmethod
    def resources(cls, params: dict, settings: dict) -> Resources:
        res = settings.get("resources") or {}
        return Resources(
            num_cpus=float(res.get("num_cpus", 1)),
            num_gpus=float(res.get("num_gpus", 0)),
            custom=dict(res.get("custom") or {}),
        )

    @classmethod
    def resolve(cls, params: dict, settings: dict) -> dict[str, Any]:
        """Every declared knob's value for this trial: the trial's parameter, else the default."""
        defaults = settings.get("defaults") or {}
        out = {}
        for name in settings.get("knobs") or {}:
            value = params.get(name, defaults.get(name))
            if value is not None:
                out[name] = value
        return out

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
        values = {**(settings.get("vars") or {}), **extra, **cls.resolve(params, settings)}
        model = values.get("model")
        if variants and model in variants and "path" in variants[model]:
            values["model_path"] = variants[model]["path"]
        argv: list[str] = []
        for item in settings["argv"]:
            group = item if isinstance(item, list) else [item]
            names = {f for part in group for f, _ in placeholders(str(part))}
            if any(values.get(n) is None for n in names):
                continue  # a knob without a value: leave the item (or group) out
            for part in group:
                argv.append(
                    "".join(
                        lit + (format(values[f], s) if s else format_value(values[f]))
                        if f is not None
                        else lit
                        for lit, f, s, _ in string.Formatter().parse(str(part))
                    )
                )
        return argv

    @classmethod
    def describe_launch(
        cls, params: dict, settings: dict, variants: dict, workload: dict | None = None
    ) -> str:
        """The command line a trial with ``params`` runs (for --dry-run)."""
        import shlex

        argv = cls.build_argv(
            params, settings, variants, cls._builtins("TRIAL_DIR", workload or {})
        )
        where = f" (in {settings['cwd']})" if settings.get("cwd") else ""
        return shlex.join(argv) + where

    @classmethod
    def export(cls, params: dict, settings: dict, variants: dict, out_dir: Path) -> list[Path]:
        """``command.json``: the winner's argv and environment, ready to run."""
        from autotune.trial.spec import write_atomic

        argv = cls.build_argv(params, settings, variants, cls._builtins(".", {}))
        path = Path(out_dir) / "command.json"
        write_atomic(
            path,
            json.dumps(
                {
                    "argv": argv,
                    "cwd": settings.get("cwd"),
                    "env": {
                        **(settings.get("env") or {}),
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

    def measure(self, workload: dict) -> tuple[dict[str, float], dict]:
        """Run the command once and parse its metrics line; raise CommandFailed otherwise."""
        argv = self.build_argv(
            self.params, self.settings, self.variants, self._builtins(str(self.workdir), workload)
        )
        env = {
            **os.environ,
            **{str(k): str(v) for k, v in (self.settings.get("env") or {}).items()},
            "AUTOTUNE_PARAMS": json.dumps(self.resolve(self.params, self.settings)),
            "AUTOTUNE_WORKLOAD": json.dumps(workload),
        }
        cwd = self.settings.get("cwd") or None
        timeout = float(self.settings.get("timeout_s", DEFAULT_TIMEOUT_S))
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
        return {"peak_rss_mb": self._rss_mb} if getattr(self, "_rss_mb", 0.0) else {}


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
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(text.strip().splitlines())[-TAIL_CHARS:]
