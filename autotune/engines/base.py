"""The Engine contract the trial runner needs (the registry of engines is autotune/registry.py).

Lifecycle of an engine in a trial worker: ``create -> start -> (generate | measure |
logprobs)* -> memory -> stop``; ``stop`` runs whatever happened before and must leave no
process, port or device memory behind. The class-level hooks (``knobs_for``,
``default_params``, ``validate_settings``, ``resources``, ``check``, ``predict``,
``export``, ``check_export``, ``context_knob_for``, ``describe_launch``) are pure and run
in the driver, so an engine module must import its heavy library (llama_cpp, vllm,
exllamav2) only inside ``start``. Instances live only in the trial subprocess and are never
pickled; there, :mod:`autotune.measure` sees one only through the
:class:`~autotune.measure.types.Generator` protocol (``generate``, ``logprobs``,
``context_tokens``, ``memory``, ``max_concurrency``, ``name``).

Every hook has a default here; an engine overrides only what is specific to it. Its
``settings`` are declared as a frozen dataclass (``settings_schema``) and checked by the same
code as the other config sections (:func:`autotune._sections.build_section`); a key that is
neither a setting nor a knob is refused with "did you mean". docs/engines.md walks through
adding an engine; :mod:`autotune.testing.engine_contract` is the conformance suite.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import ClassVar

from autotune._sections import build_section
from autotune.engines.cuda_ext import JitExtension
from autotune.engines.cuda_ext import build_extension
from autotune.engines.doctor import Check
from autotune.engines.doctor import installed_check
from autotune.engines.knob import Knob
from autotune.engines.predict import Prediction
from autotune.engines.variants import validate_variants
from autotune.errors import ConfigError
from autotune.errors import Unsupported
from autotune.errors import unknown_name
from autotune.hardware import list_gpus
from autotune.measure.types import Generation


@dataclass(frozen=True)
class Resources:
    """What one trial reserves on the Ray cluster."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    custom: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineSettings:
    """Settings every engine accepts; an engine's schema subclasses this one."""

    gpus: list = field(default_factory=list)  # the GPUs planned for: [{name, memory_gb}]
    memory_bandwidth_gbps: float | None = None  # RAM bandwidth for predict (autotune/engines/predict.py)


class Engine:
    """Base class of engine adapters. See the module docstring for the lifecycle."""

    name: ClassVar[str] = ""
    predictor: ClassVar[str] = ""  # "module:function(full_params, settings, variants) -> Prediction"
    presetter: ClassVar[str] = ""  # "module:function(models, box, name, config_dir) -> YAML" (init)
    model_formats: ClassVar[tuple[str, ...]] = ()  # model formats `autotune init` writes presets for
    knobs: ClassVar[dict[str, Knob]] = {}
    settings_schema: ClassVar[type] = EngineSettings
    uses_variants: ClassVar[bool] = True  # engine.variants are checked by models.validate_variants
    supports_quality: ClassVar[bool] = True  # logprobs() gives full next-token distributions
    quality_hint: ClassVar[str] = ""  # added to the error when quality is on but unsupported
    # the knobs that change the output distribution (autotune.run.quality_memo); None: unknown
    quality_knobs: ClassVar[tuple[str, ...] | None] = None
    max_concurrency: ClassVar[int | None] = None  # requests served at once (None: no limit)
    context_knob: ClassVar[str | None] = None  # the knob setting the context in tokens (n_ctx...)
    baseline_label: ClassVar[str] = "the engine defaults"  # what trial 0 is, as reports name it
    needs_gpu: ClassVar[bool] = False  # cannot run without a CUDA GPU (doctor's GPU check)
    no_reads_hint: ClassVar[str] = ""  # why its prediction may lack the bytes a token reads
    package_fix: ClassVar[str] = ""  # how to install its Python package (checked before a run)
    cuda_kernels: ClassVar[JitExtension | None] = None  # built in the pre-flight (autotune.engines.cuda_ext)

    # ---- driver side: pure -------------------------------------------------------
    @classmethod
    def default_params(cls, settings: dict, variants: dict) -> dict[str, Any]:
        """The engine's own defaults for every knob (the baseline, trial 0)."""
        return {}

    @classmethod
    def quality_knobs_for(cls, settings: dict) -> tuple[str, ...] | None:
        """The knobs that change the output distribution with these settings (None: unknown)."""
        return cls.quality_knobs

    @classmethod
    def doctor_checks(cls, model: Path | None = None) -> list[Check]:
        """``autotune doctor``'s checks of this engine (library, kernels, binary; a check shared
        by several engines keeps one name); ``model``: a model file for a smoke run, or None."""
        return []

    @classmethod
    def gate_checks(cls, settings: dict, space: dict) -> list[Check]:
        """Checks made before a study of this engine writes anything (fast); a fail stops it.
        By default: its Python package is installed, when it names one (``package_fix``)."""
        return installed_check(cls.name, cls.package_fix) if cls.package_fix else []

    @classmethod
    def variant_knobs(cls, params: dict[str, Any]) -> list[str]:
        """The knobs of ``params`` whose values name a model variant (the model, a draft model):
        by default ``model`` and every ``*_model`` knob."""
        return [k for k in params if k == "model" or k.endswith("_model")]

    @classmethod
    def knobs_for(cls, settings: dict) -> dict[str, Knob]:
        """The knobs this engine accepts under ``settings`` (default: the class's ``knobs``)."""
        return cls.knobs

    @classmethod
    def implicit_params(cls, settings: dict, variants: dict) -> dict[str, Any]:
        """What a trial runs with for knobs it does not set (default: :meth:`default_params`)."""
        return cls.default_params(settings, variants)

    @classmethod
    def fixed_params(cls, settings: dict) -> dict[str, Any]:
        """Knobs given a fixed value under ``settings`` (keys that are knobs, not settings)."""
        own = cls.setting_names()
        knobs = cls.knobs_for(settings)
        return {k: v for k, v in settings.items() if k in knobs and k not in own}

    @classmethod
    def tie_params(cls, full: dict[str, Any], params: dict, settings: dict) -> dict[str, Any]:
        """Adjust the full parameters where one knob follows another (default: as they are)."""
        return full

    @classmethod
    def full_params(cls, params: dict, settings: dict, variants: dict | None = None) -> dict[str, Any]:
        """Every knob's value in a trial: implicit values, then fixed settings, then ``params``.

        A parameter of None (inactive under ``when``) keeps the value below it.
        """
        out = {**cls.implicit_params(settings, variants or {}), **cls.fixed_params(settings)}
        out.update({k: v for k, v in params.items() if v is not None})
        return cls.tie_params(out, params, settings)

    @classmethod
    def setting_names(cls) -> list[str]:
        """The keys of ``settings_schema``."""
        return [f.name for f in dataclasses.fields(cls.settings_schema)]

    @classmethod
    def typed_settings(cls, settings: dict | EngineSettings) -> EngineSettings:
        """``settings`` as this engine's ``settings_schema``: its own keys, defaults filled in.

        The hooks read their settings from this frozen record (``s.num_cpus``); the mapping
        itself still carries the knobs fixed in ``settings`` (:meth:`fixed_params`). It was
        checked by :meth:`validate_settings` before any trial, so the record is built from the
        values as given (cheap: a hook may run for every configuration of the search's pool).
        """
        if isinstance(settings, cls.settings_schema):
            return settings
        own = _field_names(cls.settings_schema)
        return cls.settings_schema(**{k: v for k, v in settings.items() if k in own})

    @classmethod
    def preflight(cls, settings: dict, build: bool = True) -> list[str]:
        """What this machine lacks to run the engine (e.g. the GPUs in ``settings.gpus``).

        With ``build`` (a real run), what the engine builds once is built now, before any trial
        (its ``cuda_kernels``, unless ``settings.build_extension`` is false; a server binary);
        a dry run only looks (``build=False``)."""
        s = cls.typed_settings(settings)
        missing = cls._gpus_missing(s.gpus)
        # an engine with cuda_kernels has build_extension and extension_build_timeout_s settings
        if missing or cls.cuda_kernels is None or not build or not s.build_extension:
            return missing
        return build_extension(cls.cuda_kernels, float(s.extension_build_timeout_s))

    @staticmethod
    def _gpus_missing(wanted: list[dict]) -> list[str]:
        """The GPUs of ``settings.gpus`` (``wanted``) this machine lacks or has too small."""
        if not wanted:
            return []
        have = list_gpus()
        need = ", ".join(f"{g.get('name', 'GPU')} {g.get('memory_gb', '?')} GB" for g in wanted)
        if len(have) < len(wanted):
            seen = ", ".join(f"{g.name} {g.memory_gb:.0f} GB" for g in have) or "no NVIDIA GPU (NVML not available)"
            return [f"needs {len(wanted)} GPU(s) ({need}); this machine has {seen}"]
        small = [
            f"GPU {g.index} {g.name} has {g.memory_gb:.0f} GB < {w.get('memory_gb')} GB"
            for g, w in zip(have, wanted) if w.get("memory_gb") and g.memory_gb + 1 < w["memory_gb"]
        ]
        return small

    @classmethod
    def validate_settings(cls, settings: dict, variants: dict, path: str = "engine") -> None:
        """Raise ConfigError for bad settings or variants, before any trial starts.

        Checks, in order: the engine's own structure (:meth:`validate_structure`, e.g. the
        command engine's knob declarations), every key against ``settings_schema`` or the
        knobs, the schema's types (:func:`autotune._sections.build_section`), fixed knob
        values, the variants, then :meth:`validate_more`.
        """
        p = f"{path}.settings"
        if not isinstance(settings, dict):
            raise ConfigError(p, settings, "expected a mapping")
        cls.validate_structure(settings, p)
        own = cls.setting_names()
        knobs = cls.knobs_for(settings)
        for key in settings:
            if key not in own and key not in knobs:
                raise unknown_name(f"{p}.{key}", key, own + [k for k in knobs if k not in own],
                                   f"setting of the {cls.name} engine")
        build_section(cls.settings_schema, {k: v for k, v in settings.items() if k in own}, p)
        for key, value in cls.fixed_params(settings).items():
            if value is not None and not knobs[key].accepts(value):
                raise ConfigError(f"{p}.{key}", value, f"knob {key} takes {knobs[key].allowed()}")
        if cls.uses_variants and variants:
            validate_variants(variants, f"{path}.variants")
        cls.validate_more(settings, variants, path)

    @classmethod
    def validate_structure(cls, settings: dict, path: str) -> None:
        """Engine checks that must run before the key check (default: none)."""

    @classmethod
    def validate_more(cls, settings: dict, variants: dict, path: str = "engine") -> None:
        """Engine checks after the schema and variants (default: none)."""

    @classmethod
    def own_timeout_s(cls, settings: dict) -> float | None:
        """The engine's own per-trial timeout in ``settings`` (None: it has none).

        It must be below ``study.trial_timeout_s`` so the engine reports why it stopped.
        """
        return None

    @classmethod
    def resources(cls, params: dict, settings: dict) -> Resources:
        """Resources a trial with ``params`` reserves."""
        return Resources(num_cpus=1)

    @classmethod
    def check(cls, params: dict, settings: dict) -> list[str]:
        """Reasons why ``params`` cannot run (beyond the YAML rules); [] if it can.

        Every parameter must be a declared knob and every value (fixed or given) one the
        knob allows; then the engine's own :meth:`engine_reasons`. Not overridden.
        """
        knobs = cls.knobs_for(settings)
        reasons = [f"{k} is not a knob of engine {cls.name}; known: {', '.join(sorted(knobs))}"
                   for k in params if k not in knobs]
        given = {**cls.fixed_params(settings), **params}
        reasons += [f"{k}={v!r} is not {knobs[k].allowed()}" for k, v in given.items()
                    if k in knobs and v is not None and not knobs[k].accepts(v)]
        return reasons + cls.engine_reasons(params, settings)

    @classmethod
    def engine_reasons(cls, params: dict, settings: dict) -> list[str]:
        """Combinations this engine refuses (e.g. a quantized V cache without flash-attn)."""
        return []

    @classmethod
    def predict(cls, params: dict, settings: dict, variants: dict) -> Prediction:
        """Before launch: whether ``params`` fits and its decode upper bound (default: unknown).

        Calls ``cls.predictor`` ("module:function", imported lazily like the registry) with the
        full parameters; see autotune/engines/predict.py and docs/predict.md.
        """
        if not cls.predictor:
            return Prediction()
        estimate = _load(cls.predictor)
        return estimate(cls.full_params(params, settings, variants), settings, variants)

    @classmethod
    def init_preset(cls, models: Any, box: Any, name: str, config_dir: str) -> str:
        """The preset ``autotune init`` writes for ``models`` (a
        :class:`~autotune.engines.model_files.ModelSet`) on ``box``
        (:class:`~autotune.engines.presets.Box`): YAML text, every range with its reason. Calls
        ``cls.presetter``; only engines with ``model_formats`` have one."""
        if not cls.presetter:
            raise Unsupported(f"autotune init writes no preset for the {cls.name} engine")
        return _load(cls.presetter)(models, box, name, config_dir)

    @classmethod
    def export(cls, params: dict, settings: dict, variants: dict, out_dir: Path) -> list[Path]:
        """Write the winner in the engine's own form; return the files written."""
        return []

    @classmethod
    def context_knob_for(cls, settings: dict) -> str | None:
        """The knob setting the context length (config check, :meth:`context_tokens`)."""
        return cls.context_knob

    @classmethod
    def check_export(cls, files: list[Path]) -> list[str]:
        """Why the files :meth:`export` wrote would not run as they are: ``"<file>: <reason>"``.

        The notes go into the summary's warnings; an engine may also write them into the file
        (:func:`autotune._files.insert_comments`). Default: no check.
        """
        return []

    @classmethod
    def export_warnings(cls, params: dict, settings: dict) -> list[str]:
        """What the exported files cannot reproduce of what was measured (shown in the summary)."""
        return []

    @classmethod
    def describe_launch(cls, params: dict, settings: dict, variants: dict,
                        workload: dict | None = None) -> str:
        """What a trial with ``params`` runs, for ``--dry-run`` ('' when nothing to show)."""
        return ""

    # ---- worker side -------------------------------------------------------------
    def __init__(self, settings: dict, variants: dict, params: dict, workdir: Path) -> None:
        self.settings = settings  # the mapping: settings and the knobs fixed there
        self.opts = self.typed_settings(settings)  # the engine's settings_schema
        self.variants = variants
        self.params = params
        self.workdir = Path(workdir)
        self.info: dict[str, Any] = {}

    def start(self) -> None:
        """Load the model / start the server."""

    def context_tokens(self) -> int | None:
        """The context knob's value in ``params``, else ``settings``; None if unset or 0."""
        knob = self.context_knob_for(self.settings)
        if knob is None:
            return None
        for source in (self.params, self.settings):
            value = source.get(knob) if isinstance(source, dict) else getattr(source, knob, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    def generate(self, prompt: str, max_tokens: int, ignore_eos: bool = True) -> Generation:
        """Run one request greedily and time it."""
        raise Unsupported(f"engine {self.name} does not generate; it overrides measure() instead")

    def logprobs(self, text: str, n_tokens: int):
        """(token ids, log-softmax rows as float32 [n-1, vocab]) for quality metrics."""
        raise Unsupported(f"engine {self.name} does not expose logits: set quality.enabled: false")

    def measure(self, workload: dict) -> tuple[dict[str, float], dict]:
        """Run the workload; returns (metrics, raw samples). Default: the shared timing loop."""
        from autotune.measure.workload import run_workload  # numpy: in the worker only

        return run_workload(self, workload)

    def quality(self, quality: dict) -> dict[str, float]:
        """Quality metrics vs the study's reference. Default: from :meth:`logprobs`."""
        from autotune.measure.quality import quality_metrics  # numpy: in the worker only

        return quality_metrics(self, quality)

    def memory(self) -> dict[str, float]:
        """Memory metrics sampled now (peak RSS, peak VRAM)."""
        return {}

    def stop(self) -> None:
        """Release everything start() acquired; safe to call after a failed or no start."""


@functools.cache
def _field_names(schema: type) -> frozenset[str]:
    """The field names of a settings schema, once per class."""
    return frozenset(f.name for f in dataclasses.fields(schema))


def _load(target: str) -> Any:
    """The function a ``"module:function"`` hook names, its module imported on first use."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
