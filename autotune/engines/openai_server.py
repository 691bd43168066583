"""Any OpenAI-compatible server started from an argv template: ``engine.kind: openai_server``.

The server command is a list in ``engine.settings.argv``; each item is filled with
``str.format`` from the trial's parameters, the fixed settings, ``{port}``, ``{model_path}``
(the resolved ``model`` variant), ``{python}`` (this interpreter) and ``{workdir}``. It is
started without a shell, bound to 127.0.0.1, and measured through the shared streaming
client (:mod:`autotune.engines._openai_stream`). Booleans render as ``true``/``false``,
lists as ``a,b``, and an item that renders to the empty string is dropped, so a parameter
can switch a flag off. Literal braces are written ``{{`` and ``}}``.

Settings: ``argv`` (required), ``knobs`` ({name: {type, choices, low, high, doc}}: the
parameters the template accepts), ``health_path`` (default ``/v1/models``),
``startup_timeout_s`` (120), ``model_name`` (default: the first id of ``/v1/models``),
``env`` (extra environment, templated too), ``request`` (extra request fields),
``count_path`` (a token-count endpoint for servers that send no ``usage`` chunk, e.g.
llama-cpp-python's ``/extras/tokenize/count``), ``num_cpus`` / ``num_gpus`` (resources),
``vars`` (constants usable as placeholders), ``context_knob`` (the declared knob that sets
the context, e.g. ``n_ctx``: the context ladder stays within it and the config check
refuses contexts too small for the workload); the schema is :class:`OpenAIServerSettings`.
The template is rendered by the same code as the ``command`` engine's
(:mod:`autotune.engines._argv`), with items that render to '' dropped.

A server that reads a config file gets one from ``config_file``: ``{path: config.yml,
format: yaml | json, template: {...}}``. The template is any YAML/JSON structure; a string
that is exactly one placeholder (``"{cache_mode}"``) takes the value itself (an int stays an
int, None stays null), any other string is filled as text like an argv item. Keys are never
templated. The file is written into the trial's workdir before the server starts (and next
to ``server.sh`` by the export), and ``{config_path}`` names it in ``argv``: TabbyAPI's
``config.yml``, ``vllm serve --config`` or SGLang's ``--config`` fit without new code. No
shell is ever involved: values go into the document, never through a command line.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import yaml

from autotune._files import write_atomic
from autotune._process_group import descendants
from autotune._process_group import stop_tree
from autotune.engines._argv import render_argv
from autotune.engines._argv import render_item
from autotune.engines._config_doc import check_config_file
from autotune.engines._config_doc import render_document
from autotune.engines._openai_stream import HOST
from autotune.engines._openai_stream import free_port
from autotune.engines._openai_stream import post_json
from autotune.engines._openai_stream import served_model
from autotune.engines._openai_stream import stream_completion
from autotune.engines._openai_stream import wait_healthy
from autotune.engines.base import Engine
from autotune.engines.base import EngineSettings
from autotune.engines.base import Knob
from autotune.engines.base import Resources
from autotune.engines.variants import resolve_variant
from autotune.errors import ConfigError
from autotune.errors import InfeasibleConfig
from autotune.errors import RequestRejected
from autotune.errors import unknown_name
from autotune.measure.types import Generation

STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class ServerSettings(EngineSettings):
    """Settings every server engine accepts (``openai_server``, ``vllm``)."""

    defaults: dict = field(default_factory=dict)  # the baseline (trial 0) over the defaults
    default_variant: str | None = None  # the baseline's model variant (default: the first)
    python: str | None = None  # the interpreter for {python} / the server
    env: dict = field(default_factory=dict)  # extra environment of the server
    num_cpus: float | None = None  # Ray CPUs per trial
    health_path: str | None = None  # polled until HTTP 200 (default: the engine's)
    startup_timeout_s: float | None = None  # give up on a server not healthy by then
    stop_timeout_s: float = STOP_GRACE_S  # SIGTERM, then SIGKILL after this long
    request_timeout_s: float = 600.0  # socket timeout of one completion request
    model_name: str | None = None  # the request's model (default: the first of /v1/models)
    request: dict = field(default_factory=dict)  # extra fields of every completion request
    count_path: str | None = None  # token-count endpoint for servers that send no usage


@dataclass(frozen=True)
class OpenAIServerSettings(ServerSettings):
    """``engine.settings`` of ``openai_server`` (see the module docstring)."""

    argv: list = field(default_factory=list)  # the server command, a template (no shell)
    knobs: dict = field(default_factory=dict)  # name -> {type, choices, low, high, doc, spelling}
    vars: dict = field(default_factory=dict)  # constants usable as {name} in argv and env
    num_gpus: float = 0.0  # Ray GPUs per trial
    export_port: int = 8000  # the port written into server.sh
    context_knob: str | None = None  # the declared knob that sets the server's context (n_ctx...)
    config_file: dict = field(default_factory=dict)  # {path, format: yaml|json, template}


def knobs_from_settings(settings: dict, path: str = "engine.settings.knobs") -> dict[str, Knob]:
    """Parse ``settings.knobs`` ({name: {type, choices, low, high, doc}}) into Knobs."""
    raw = settings.get("knobs") or {}
    if not isinstance(raw, dict):
        raise ConfigError(path, raw, "expected a mapping of knob name -> {type, choices, low, high}")
    out = {"model": Knob("str", doc="model variant name (engine.variants)")}
    out.update({name: Knob.parse(name, spec, f"{path}.{name}", default_type="str")
                for name, spec in raw.items()})
    return out


class OpenAIServerEngine(Engine):
    """A server process per trial, measured over ``/v1/completions`` streaming.

    Lifecycle: ``start`` picks a free port, starts the command (its own log in the trial's
    workdir) and waits for the health URL; ``generate`` is thread-safe (one connection per
    request); ``stop`` terminates the server, then kills it. The server also belongs to the
    trial's process group, so a killed trial never leaves it behind.
    """

    name = "openai_server"
    settings_schema: type = OpenAIServerSettings
    supports_quality = False  # an OpenAI server returns no full next-token distributions
    knobs: dict[str, Knob] = {"model": Knob("str", doc="model variant name (engine.variants)")}
    proc: subprocess.Popen | None = None  # the server, between start and stop
    default_health_path = "/v1/models"
    default_startup_timeout_s = 120.0

    # ---- driver side: pure -------------------------------------------------------
    @classmethod
    def knobs_for(cls, settings: dict) -> dict[str, Knob]:
        """The knobs this engine accepts given its settings (declared in settings.knobs).

        ``Engine.knobs`` is a ClassVar; a template engine's knobs depend on its settings,
        so validation should call this hook when it exists.
        """
        return knobs_from_settings(settings)

    @classmethod
    def default_params(cls, settings: dict, variants: dict) -> dict[str, Any]:
        s = cls.typed_settings(settings)
        out: dict[str, Any] = dict(s.defaults)
        if variants:
            out.setdefault("model", s.default_variant or next(iter(variants)))
        return out

    @classmethod
    def validate_more(cls, settings: dict, variants: dict, path: str = "engine") -> None:
        argv = settings.get("argv")
        if not argv:
            raise ConfigError(f"{path}.settings.argv", argv, "expected the server command as a list")
        values = cls._placeholder_values(cls.default_params(settings, variants), settings, 0, "", "")
        values |= dict.fromkeys(cls.knobs_for(settings))  # None: names checked, nothing rendered
        render_argv(argv, values, f"{path}.settings.argv", drop_empty=True)
        if settings.get("config_file"):
            check_config_file(settings["config_file"], f"{path}.settings.config_file")
            render_document(settings["config_file"]["template"], values,
                            f"{path}.settings.config_file.template")
        knob = settings.get("context_knob")
        if knob is not None and knob not in cls.knobs_for(settings):
            raise unknown_name(f"{path}.settings.context_knob", knob,
                               [k for k in cls.knobs_for(settings) if k != "model"], "declared knob")

    @classmethod
    def context_knob_for(cls, settings: dict) -> str | None:
        """The knob named by ``settings.context_knob`` (a template server declares its own)."""
        return settings.get("context_knob") or cls.context_knob

    @classmethod
    def resources(cls, params: dict, settings: dict) -> Resources:
        s = cls.typed_settings(settings)
        return Resources(num_cpus=float(s.num_cpus or 1), num_gpus=float(s.num_gpus))

    @classmethod
    def _placeholder_values(cls, params: dict, settings: dict, port: int, model_path: str,
                            workdir: str) -> dict[str, Any]:
        fixed = {k: v for k, v in settings.items() if not isinstance(v, dict)}
        name = cls.config_file_name(settings)
        s = cls.typed_settings(settings)
        return {**s.vars, **fixed, **params, "port": port, "host": HOST, "model_path": model_path,
                "python": s.python or sys.executable, "workdir": workdir,
                "config_path": str(Path(workdir) / name) if name else ""}

    @classmethod
    def config_file_name(cls, settings: dict) -> str | None:
        """The config file's name in the trial's workdir (None: the server reads none)."""
        return (settings.get("config_file") or {}).get("path")

    @classmethod
    def config_text(cls, params: dict, settings: dict, variants: dict, port: int, model_path: str,
                    workdir: str = ".") -> str | None:
        """The server's config file for ``params`` (None without one); subclasses build their own."""
        spec = settings.get("config_file") or {}
        if not spec:
            return None
        values = cls._placeholder_values(params, settings, port, model_path, workdir)
        doc = render_document(spec["template"], values, "engine.settings.config_file.template")
        if spec.get("format", "yaml") == "json":
            return json.dumps(doc, indent=2) + "\n"
        return yaml.safe_dump(doc, sort_keys=False)

    @classmethod
    def server_argv(cls, params: dict, settings: dict, port: int, model_path: str,
                    workdir: str = ".") -> list[str]:
        """The server's argv for ``params`` (no shell is ever involved)."""
        values = cls._placeholder_values(params, settings, port, model_path, workdir)
        return render_argv(cls.typed_settings(settings).argv, values, drop_empty=True)

    @classmethod
    def server_env(cls, params: dict, settings: dict, port: int, model_path: str,
                   workdir: str = ".") -> dict[str, str]:
        """Extra environment variables for the server (templated like argv)."""
        env = cls.typed_settings(settings).env
        values = cls._placeholder_values(params, settings, port, model_path, workdir)
        return {k: render_item(str(v), values) for k, v in env.items()}

    @classmethod
    def export(cls, params: dict, settings: dict, variants: dict, out_dir: Path) -> list[Path]:
        p = cls.full_params(params, settings, variants)
        v = variants.get(p.get("model"), {}) if variants else {}
        model_path = v.get("path") or (f"<variant {p['model']}>" if p.get("model") else "")
        port = int(cls.typed_settings(settings).export_port)
        argv = cls.server_argv(p, settings, port, model_path, ".")
        env = cls.server_env(p, settings, port, model_path, ".")
        lines = ["#!/usr/bin/env sh", "# Winner exported by autotune (engine openai_server)."]
        lines += [f"export {k}={shlex.quote(val)}" for k, val in env.items()]
        files = []
        text = cls.config_text(p, settings, variants, port, model_path, ".")
        if text is not None:  # the config file lies next to server.sh, which runs from there
            files.append(out_dir / cls.config_file_name(settings))
            write_atomic(files[-1], text)
            lines.append('cd "$(dirname "$0")"')
        path = out_dir / "server.sh"
        write_atomic(path, "\n".join(lines + [shlex.join(argv)]) + "\n")
        path.chmod(0o755)
        return [path, *files]

    # ---- worker side -------------------------------------------------------------
    def _model_path(self) -> str:
        p = self.full_params(self.params, self.settings, self.variants)
        if not self.variants or not p.get("model"):
            return ""
        return str(resolve_variant(p["model"], self.variants))

    def _argv_env(self, port: int, model_path: str) -> tuple[list[str], dict[str, str]]:
        """argv and extra env of this trial's server; subclasses build their own."""
        p = self.full_params(self.params, self.settings, self.variants)
        wd = str(self.workdir)
        return (self.server_argv(p, self.settings, port, model_path, wd),
                self.server_env(p, self.settings, port, model_path, wd))

    def _startup_failed(self, error: Exception) -> Exception:
        """Map a failed start to the exception to raise (subclasses spot bad configs)."""
        return error

    def start(self) -> None:
        self.proc = None
        self.port = free_port()
        self.base_url = f"http://{HOST}:{self.port}"
        model_path = self._model_path()
        argv, env = self._argv_env(self.port, model_path)
        self.workdir.mkdir(parents=True, exist_ok=True)
        p = self.full_params(self.params, self.settings, self.variants)
        text = self.config_text(p, self.settings, self.variants, self.port, model_path, str(self.workdir))
        if text is not None:  # written before the server starts: it reads it at start-up
            self.config_path = self.workdir / self.config_file_name(self.settings)
            write_atomic(self.config_path, text)
            self.info["server_config"] = str(self.config_path)
        self.log_path = self.workdir / "server.log"
        self.info.update(server_argv=argv, server_port=self.port, server_log=str(self.log_path))
        if model_path:
            self.info["model_path"] = model_path
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **env}, cwd=self.workdir,
            )
        self.info["server_pid"] = self.proc.pid
        health = self.opts.health_path
        health = self.default_health_path if health is None else health
        timeout = self.opts.startup_timeout_s
        timeout = float(self.default_startup_timeout_s if timeout is None else timeout)
        try:
            self.info["server_start_s"] = wait_healthy(self.base_url + health, timeout, self.proc,
                                                       self.log_path)
        except (RuntimeError, TimeoutError) as e:
            raise self._startup_failed(e) from e
        self.model_name = self.opts.model_name or served_model(self.base_url)
        self.info["served_model"] = self.model_name

    def _count_tokens(self, text: str) -> int:
        return int(post_json(self.base_url, self.opts.count_path,
                             {"input": text, "model": self.model_name})["count"])

    def request_fields(self) -> dict:
        """Extra fields of every completion request (settings.request)."""
        return dict(self.opts.request)

    def generate(self, prompt: str, max_tokens: int, ignore_eos: bool = True) -> Generation:
        count = self._count_tokens if self.opts.count_path else None
        try:
            gen, details = stream_completion(
                self.base_url, prompt, max_tokens, model=self.model_name, ignore_eos=ignore_eos,
                timeout_s=float(self.opts.request_timeout_s),
                extra=self.request_fields(), count_tokens=count,
            )
        except RequestRejected as e:
            if e.status == 400:
                raise InfeasibleConfig(f"the server rejected the request: {e}") from e
            raise
        self.info["token_count_source"] = details["token_count_source"]
        return gen

    def memory(self) -> dict[str, float]:
        """Peak RSS (VmHWM) of the server and its descendants, summed, in MB.

        Shared pages are counted once per process, so this is an upper bound.
        """
        proc = self.proc
        if proc is None:
            return {}
        total_kb = 0
        for pid in [proc.pid] + [pid for pid, _ in descendants(proc.pid)]:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    total_kb += int(line.split()[1])
        return {"peak_rss_mb": total_kb / 1024.0} if total_kb else {}

    def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        stop_server(proc, float(self.opts.stop_timeout_s))
        self.info["server_exit_code"] = proc.returncode
        self.proc = None


def stop_server(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the server, SIGKILL after ``grace_s``; then kill descendants it left behind
    (e.g. vLLM's engine-core and worker processes): :func:`autotune._process_group.stop_tree`."""
    stop_tree(proc, grace_s)

