"""The Engine contract the trial runner needs, and the lazy registry of engines.

Lifecycle of an engine in a trial worker: ``create -> start -> (generate | measure |
logprobs)* -> stop``. The class-level methods (``knobs``, ``default_params``,
``resources``, ``check``, ``export``) are pure and run in the driver, so an engine module
must import its heavy library (llama_cpp, vllm, exllamav2) only inside ``start``.
Instances live only in the trial subprocess and are never pickled.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import ClassVar

from autotune.errors import ConfigError
from autotune.errors import unknown_name

# name -> "module:Class"; importing autotune never imports an engine's library.
ENGINES: dict[str, str] = {
    "llamacpp": "autotune.engines.llamacpp:LlamaCppEngine",
    "command": "autotune.engines.command:CommandEngine",
    "fake": "autotune.engines.fake:FakeEngine",
    "exllamav2": "autotune.engines.exllamav2:ExLlamaV2Engine",
    "vllm": "autotune.engines.vllm:VLLMEngine",
    "openai_server": "autotune.engines.openai_server:OpenAIServerEngine",
}


@dataclass(frozen=True)
class Knob:
    """A parameter an engine accepts: its type, allowed values and the engine's spelling."""

    type: str  # "int" | "float" | "bool" | "str" | "list" | "str|list"
    choices: tuple | None = None
    low: float | None = None
    high: float | None = None
    spelling: str = ""
    doc: str = ""

    def allowed(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(map(str, self.choices))
        if self.type in ("int", "float"):
            lo = "-inf" if self.low is None else f"{self.low:g}"
            hi = "inf" if self.high is None else f"{self.high:g}"
            return f"a{'n' if self.type == 'int' else ''} {self.type} in [{lo}, {hi}]"
        return f"a {self.type}"

    def accepts(self, value: Any) -> bool:
        if self.type == "bool":
            ok = isinstance(value, bool)
        elif self.type == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif self.type == "float":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif self.type == "list":
            ok = isinstance(value, (list, tuple))
        elif self.type == "str|list":
            ok = isinstance(value, (str, list, tuple))
        else:
            ok = isinstance(value, str)
        if not ok:
            return False
        if self.choices is not None and value not in self.choices:
            return False
        if self.type in ("int", "float"):
            if self.low is not None and value < self.low:
                return False
            if self.high is not None and value > self.high:
                return False
        return True


@dataclass(frozen=True)
class Resources:
    """What one trial reserves on the Ray cluster."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    custom: dict[str, float] = field(default_factory=dict)


@dataclass
class Generation:
    """One request's timing, from the engine's own token counts.

    ``chunk_times`` are seconds since submit at which output arrived; ``output_tokens``
    is the engine's count (a chunk may hold several tokens under speculative decoding).
    """

    prompt_tokens: int
    output_tokens: int
    chunk_times: list[float]
    e2e_s: float
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0


class Unsupported(RuntimeError):
    """An optional capability the engine does not have (e.g. full logits for quality)."""


class InfeasibleConfig(Exception):
    """Raised by an engine when the trial's parameters cannot run (recorded as infeasible)."""


class Engine:
    """Base class of engine adapters. See the module docstring for the lifecycle."""

    name: ClassVar[str] = ""
    knobs: ClassVar[dict[str, Knob]] = {}
    uses_variants: ClassVar[bool] = True  # the space's ``model`` knob picks engine.variants
    supports_quality: ClassVar[bool] = True  # logprobs() gives full next-token distributions

    # ---- driver side: pure -------------------------------------------------------
    @classmethod
    def default_params(cls, settings: dict, variants: dict) -> dict[str, Any]:
        """The engine's own defaults for every knob (the baseline, trial 0)."""
        return {}

    @classmethod
    def knobs_for(cls, settings: dict) -> dict[str, Knob]:
        """The knobs this engine accepts under ``settings`` (default: the class's ``knobs``)."""
        return cls.knobs

    @classmethod
    def preflight(cls, settings: dict) -> list[str]:
        """What this machine lacks to run the engine (e.g. the GPUs in ``settings.gpus``)."""
        wanted = settings.get("gpus") or []
        if not wanted:
            return []
        from autotune.gpus import list_gpus

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
        """Raise ConfigError for bad fixed settings or variants."""

    @classmethod
    def resources(cls, params: dict, settings: dict) -> Resources:
        """Resources a trial with ``params`` reserves."""
        return Resources(num_cpus=1)

    @classmethod
    def check(cls, params: dict, settings: dict) -> list[str]:
        """Reasons why ``params`` cannot run (beyond the YAML rules); [] if it can."""
        return []

    @classmethod
    def export(cls, params: dict, settings: dict, variants: dict, out_dir: Path) -> list[Path]:
        """Write the winner in the engine's own form; return the files written."""
        return []

    @classmethod
    def export_warnings(cls, params: dict, settings: dict) -> list[str]:
        """What the exported files cannot reproduce of what was measured (shown in the summary)."""
        return []

    # ---- worker side -------------------------------------------------------------
    def __init__(self, settings: dict, variants: dict, params: dict, workdir: Path) -> None:
        self.settings = settings
        self.variants = variants
        self.params = params
        self.workdir = Path(workdir)
        self.info: dict[str, Any] = {}

    def start(self) -> None:
        """Load the model / start the server."""

    def generate(self, prompt: str, max_tokens: int, ignore_eos: bool = True) -> Generation:
        """Run one request greedily and time it."""
        raise Unsupported(f"engine {self.name} does not generate; it overrides measure() instead")

    def logprobs(self, text: str, n_tokens: int):
        """(token ids, log-softmax rows as float32 [n-1, vocab]) for quality metrics."""
        raise Unsupported(f"engine {self.name} does not expose logits: set quality.enabled: false")

    def measure(self, workload: dict) -> tuple[dict[str, float], dict]:
        """Run the workload; returns (metrics, raw samples). Default: the shared timing loop."""
        from autotune.measure.workload import run_workload

        return run_workload(self, workload)

    def quality(self, quality: dict) -> dict[str, float]:
        """Quality metrics vs the study's reference. Default: from :meth:`logprobs`."""
        from autotune.measure.quality import quality_metrics

        return quality_metrics(self, quality)

    def memory(self) -> dict[str, float]:
        """Memory metrics sampled now (peak RSS, peak VRAM)."""
        return {}

    def stop(self) -> None:
        """Release everything start() acquired."""


def get_engine_class(kind: str, path: str = "engine.kind") -> type[Engine]:
    """Import an engine class by registry name (only its module, not its library)."""
    target = ENGINES.get(kind)
    if target is None:
        raise unknown_name(path, kind, ENGINES, "engine")
    module, _, cls = target.partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as e:
        raise ConfigError(path, kind, f"engine module {module} cannot be imported: {e}") from e


def cpu_count() -> int:
    """CPUs this process may use (affinity-aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1
