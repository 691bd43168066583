"""A user's TabbyAPI checkout as the engine: ``kind: tabbyapi`` (GPU only to run for real).

Each trial writes ``config.yml`` into its workdir with the same code as the export
(:func:`tabby_document`: :func:`autotune.engines.exllamav3.plan.tabby_config` for
``backend: exllamav3``, TabbyAPI main; :func:`autotune.engines.exllamav2.plan.tabby_config`
for ``backend: exllamav2``, TabbyAPI exl2-checkpoint), starts ``<python> <tabby_dir>/main.py``
there (TabbyAPI reads ``config.yml`` from its working directory, so a ``config.yml`` in the
checkout plays no part), waits for ``GET /health``, measures through its OpenAI API
(``/v1/completions`` streaming, :class:`autotune.engines.openai_server.OpenAIServerEngine`)
and stops it whole. The exported ``tabbyapi.yml`` is the measured ``config.yml`` with two
differences, both in ``network``: the trial's port is a free one and ``disable_auth: true``
(no API key on 127.0.0.1 during the study).

Settings: ``tabby_dir`` (required: the checkout), ``backend`` (exllamav3 | exllamav2: which
branch the checkout is), ``python`` (default ``<tabby_dir>/venv/bin/python``, the venv that
TabbyAPI's start script makes, else this interpreter), ``entry`` (default ``main.py``),
``gpus``. The knobs are the backend engine's, less what TabbyAPI cannot set (ExLlamaV2's
``layer_skip_threshold``, ``paged`` and ``num_draft_tokens``: TabbyAPI always drafts 4).
A start that runs out of GPU memory is infeasible; any other exit (a wrong model directory,
a refused option) fails the trial with the server's log tail.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune._files import tail as log_tail
from autotune.engines._gpu_sampled import GpuSampled
from autotune.engines.base import Engine
from autotune.engines.base import Knob
from autotune.engines.base import Resources
from autotune.engines.openai_server import OpenAIServerEngine
from autotune.engines.openai_server import ServerSettings
from autotune.engines.predict import Prediction
from autotune.errors import ConfigError
from autotune.errors import InfeasibleConfig
from autotune.errors import ServerExited
from autotune.errors import unknown_name

BACKENDS = {"exllamav3": "main", "exllamav2": "exl2-checkpoint"}
NOT_IN_TABBY = {"exllamav2": ("layer_skip_threshold", "paged", "num_draft_tokens"), "exllamav3": ()}
# Lines of TabbyAPI's log that mean "this configuration does not fit the GPUs".
OOM_MARKERS = ("out of memory", "outofmemoryerror", "insufficient vram", "insufficient space")


@dataclass(frozen=True)
class TabbyAPISettings(ServerSettings):
    """``engine.settings`` of ``tabbyapi`` (see the module docstring)."""

    tabby_dir: str = ""  # the TabbyAPI checkout (main for exllamav3, exl2-checkpoint for exllamav2)
    backend: str = "exllamav3"  # exllamav3 (TabbyAPI main) | exllamav2 (exl2-checkpoint)
    entry: str = "main.py"  # the script in tabby_dir that starts TabbyAPI
    num_gpus: float | None = None  # Ray GPUs per trial (default: the planned GPUs)
    export_port: int | None = None  # the port written into tabbyapi.yml


def backend_engine(settings: dict) -> type[Engine]:
    """The in-process engine whose knobs, plan and export form this backend uses."""
    if settings.get("backend", "exllamav3") == "exllamav2":
        from autotune.engines.exllamav2.engine import ExLlamaV2Engine

        return ExLlamaV2Engine
    from autotune.engines.exllamav3.engine import ExLlamaV3Engine

    return ExLlamaV3Engine


def tabby_document(params: dict, settings: dict, variants: dict) -> tuple[dict, list[str]]:
    """(config.yml as a dict, what TabbyAPI runs differently) for the backend's branch.

    The one writer of TabbyAPI configs: the ``exllamav2``/``exllamav3`` exports and every
    ``tabbyapi`` trial and export call it.
    """
    engine = backend_engine(settings)
    p = engine.full_params(params, settings, variants)
    if engine.name == "exllamav2":
        from autotune.engines.exllamav2.plan import tabby_config
        from autotune.engines.exllamav2.plan import tabby_warnings

        warnings = [w for w in tabby_warnings(p, settings) if "num_draft_tokens" not in w]
        return tabby_config(p, settings, variants), warnings
    from autotune.engines.exllamav3.plan import tabby_config
    from autotune.engines.exllamav3.plan import tabby_warnings

    return tabby_config(p, settings, variants), tabby_warnings(p, settings, in_process=False)


class TabbyAPIEngine(GpuSampled, OpenAIServerEngine):
    """TabbyAPI started from the user's checkout with the trial's ``config.yml``."""

    name = "tabbyapi"
    needs_gpu = True
    settings_schema = TabbyAPISettings
    context_knob = "max_seq_len"
    default_health_path = "/health"
    default_startup_timeout_s = 900.0  # a 70B model loads for minutes

    @classmethod
    def knobs_for(cls, settings: dict) -> dict[str, Knob]:
        drop = NOT_IN_TABBY.get(settings.get("backend", "exllamav3"), ())
        return {k: v for k, v in backend_engine(settings).knobs.items() if k not in drop}

    @classmethod
    def context_knob_for(cls, settings: dict) -> str | None:
        return "max_seq_len"

    @classmethod
    def default_params(cls, settings: dict, variants: dict) -> dict[str, Any]:
        knobs = cls.knobs_for(settings)
        out = backend_engine(settings).default_params(settings, variants)
        return {k: v for k, v in out.items() if k in knobs}

    @classmethod
    def validate_more(cls, settings: dict, variants: dict, path: str = "engine") -> None:
        backend = settings.get("backend", "exllamav3")
        if backend not in BACKENDS:
            raise unknown_name(f"{path}.settings.backend", backend, list(BACKENDS), "TabbyAPI backend")
        tabby = settings.get("tabby_dir")
        if not tabby:
            raise ConfigError(f"{path}.settings.tabby_dir", tabby,
                              "the path of a TabbyAPI checkout (git clone theroyallab/tabbyAPI)")
        entry = Path(str(tabby)).expanduser() / str(settings.get("entry", "main.py"))
        if not entry.is_file():
            raise ConfigError(f"{path}.settings.tabby_dir", tabby,
                              f"a TabbyAPI checkout with {entry.name} (not found: {entry})")
        backend_engine(settings).validate_more(settings, variants, path)

    @classmethod
    def resources(cls, params: dict, settings: dict) -> Resources:
        inner = backend_engine(settings).resources(params, settings)
        s = cls.typed_settings(settings)
        gpus = s.num_gpus
        return Resources(num_cpus=float(s.num_cpus or 1),
                         num_gpus=float(inner.num_gpus if gpus is None else gpus))

    @classmethod
    def engine_reasons(cls, params: dict, settings: dict) -> list[str]:
        return backend_engine(settings).engine_reasons(params, settings)

    @classmethod
    def predict(cls, params: dict, settings: dict, variants: dict) -> Prediction:
        return backend_engine(settings).predict(params, settings, variants)

    @classmethod
    def export_warnings(cls, params: dict, settings: dict) -> list[str]:
        return tabby_document(params, settings, {})[1]

    @classmethod
    def export(cls, params: dict, settings: dict, variants: dict, out_dir: Path) -> list[Path]:
        from autotune.engines.exllamav3.plan import tabby_yaml

        doc, warnings = tabby_document(params, settings, variants)
        from autotune.engines.tabbyapi.check import write_tabby_files

        branch = BACKENDS[cls.typed_settings(settings).backend]
        return write_tabby_files(out_dir, tabby_yaml(doc, warnings, branch), warnings)

    @classmethod
    def check_export(cls, files: list[Path]) -> list[str]:
        from autotune.engines.tabbyapi.check import check_tabby_files

        return check_tabby_files(files)

    @classmethod
    def describe_launch(cls, params: dict, settings: dict, variants: dict,
                        workload: dict | None = None) -> str:
        doc = cls.trial_document(params, settings, variants, 0)
        return f"TabbyAPI ({cls.typed_settings(settings).tabby_dir}) with config.yml {doc}"

    # ---- the trial's config.yml ------------------------------------------------------------
    @classmethod
    def trial_document(cls, params: dict, settings: dict, variants: dict, port: int) -> dict:
        """The export's document, on the trial's port and without API keys."""
        doc, _ = tabby_document(params, settings, variants)
        doc["network"] = {**doc["network"], "port": int(port), "disable_auth": True}
        return doc

    @classmethod
    def config_file_name(cls, settings: dict) -> str | None:
        return "config.yml"

    @classmethod
    def config_text(cls, params: dict, settings: dict, variants: dict, port: int, model_path: str,
                    workdir: str = ".") -> str | None:
        import yaml

        return yaml.safe_dump(cls.trial_document(params, settings, variants, port), sort_keys=False)

    def _model_path(self) -> str:
        return ""  # TabbyAPI finds the model from config.yml (model_dir / model_name)

    def _argv_env(self, port: int, model_path: str) -> tuple[list[str], dict[str, str]]:
        tabby = Path(str(self.opts.tabby_dir)).expanduser().resolve()
        python = self.opts.python
        if not python:
            venv = tabby / "venv" / "bin" / "python"
            python = str(venv) if venv.is_file() else sys.executable
        env = {str(k): str(v) for k, v in self.opts.env.items()}
        return [str(python), str(tabby / str(self.opts.entry))], env

    def start(self) -> None:
        """Sample the GPUs from before the load (TabbyAPI loads before /health answers), then start."""
        self.info["tabby_branch"] = BACKENDS[self.opts.backend]
        super().start()  # GpuSampled: the sampling starts first

    def _startup_failed(self, error: Exception) -> Exception:
        """Out of GPU memory while loading: infeasible; anything else fails the trial."""
        text = getattr(error, "log_tail", "") or log_tail(getattr(self, "log_path", None))
        for line in reversed(text.splitlines()):
            if any(m in line.lower() for m in OOM_MARKERS):
                return InfeasibleConfig(f"out of GPU memory while TabbyAPI loaded the model: {line.strip()}")
        if isinstance(error, ServerExited):
            return ServerExited(f"TabbyAPI exited before it was healthy "
                                f"({self.info.get('server_config')})", text)
        return error
