"""The real ``llama-server`` as an engine: ``engine.kind: llama_server``.

Each trial starts the binary (found or built by :mod:`autotune.engines.llama_server.build`)
on 127.0.0.1 and a free port, in its own process group, waits for ``/health`` and measures
through the OpenAI streaming client shared with ``openai_server``; ``stop`` kills it whole.

The knobs are llama-server's own flags (:mod:`autotune.engines.llama_server.knobs`). A flag
is passed only when its value differs from what llama-server uses without it, so trial 0
(the baseline: :meth:`LlamaServerEngine.default_params`) runs ``llama-server --model M
--host 127.0.0.1 --port P`` and nothing else: the server as users start it. The export
``llama-server.sh`` is built by the same :func:`server_argv` as the trial's command: the
measured binary, the measured flags and the real model path, only the port differs.

GPU memory: ``vram_peak_gb`` from NVML as for every GPU trial (:mod:`autotune.engines._gpu_sampled`),
and the server's own buffer sizes from its load log in ``info.server_buffers_mib``.

Failures: a server that dies or logs an allocation failure (out of memory at load or decode)
is infeasible; a refused flag or a missing model is a plain failure carrying the server's own
error line.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune._files import write_atomic
from autotune.engines._gpu_sampled import GpuSampled
from autotune.engines._openai_stream import HOST
from autotune.engines.base import Knob
from autotune.engines.base import Resources
from autotune.engines.doctor import Check
from autotune.engines.llama_server.build import BuildError
from autotune.engines.llama_server.build import check_llama_server
from autotune.engines.llama_server.build import ensure_binary
from autotune.engines.llama_server.build import find_binary
from autotune.engines.llama_server.knobs import FLAGS
from autotune.engines.llama_server.knobs import KNOBS
from autotune.engines.llama_server.knobs import UNQUANTIZED_KV
from autotune.engines.llama_server.knobs import placement_override
from autotune.engines.llama_server.knobs import server_defaults
from autotune.engines.llamacpp.server_flags import argv_reasons
from autotune.engines.openai_server import OpenAIServerEngine
from autotune.engines.openai_server import ServerSettings
from autotune.engines.variants import resolve_variant
from autotune.engines.variants import validate_variants
from autotune.errors import InfeasibleConfig

# an allocation that failed (ggml-cuda's "cudaMalloc failed: out of memory", ggml's "insufficient
# memory", "failed to allocate buffer for kv cache"); "OOM" as a word, so a path holding "bloom" is not one
OOM = re.compile(r"(?i:out of memory|failed to allocate|cannot allocate|bad_alloc|unable to allocate|"
                 r"insufficient memory|OutOfDeviceMemory|memory allocation of size)|\bOOM\b")  # Vulkan: the last two
# llama.cpp refused the context; with no failed allocation beside it, the configuration is the
# cause, named by the error line before it ("V cache type q8_0 with block size 32 does not
# divide n_embd_head_v=16", "quantized V cache requires flash_attn to be enabled")
NO_CONTEXT = re.compile(r"failed to create[ _]context|failed to create llama_context", re.I)
LOG_ERROR = re.compile(r"^[\d.]+ E (?:\w+\s+)?(.*)$")  # llama.cpp's "0.00.011.048 E llama_init_from_model: ..."
ERROR_LINE = re.compile(r"error|invalid|failed|unknown|not found|no such", re.I)
# llama.cpp's load log: "load_tensors:        CUDA0 model buffer size =   133.43 MiB" (also KV,
# compute, output; CPU, CPU_Mapped, CUDA_Host for host memory)
BUFFER = re.compile(r"\s(\S+)\s+(model|KV|compute|output) buffer size =\s*([\d.]+) MiB")


def refusal_cause(log: str) -> str:
    """The error line that made llama.cpp refuse the context: the last one before the first
    "failed to create context" that is not itself a consequence (the fit's retry, the refusal)."""
    lines = log.splitlines()
    first = next(i for i, x in enumerate(lines) if NO_CONTEXT.search(x))
    causes = [m.group(1).strip() for x in lines[:first] if (m := LOG_ERROR.match(x.strip()))
              and not NO_CONTEXT.search(x) and "fit params" not in x]
    return causes[-1] if causes else lines[first].strip()


def server_buffers(log: str) -> dict[str, float]:
    """The buffers llama-server says it allocated, ``"<device> <kind>" -> MiB`` (summed)."""
    out: dict[str, float] = {}
    for dev, kind, mib in BUFFER.findall(log):
        out[f"{dev} {kind}"] = round(out.get(f"{dev} {kind}", 0.0) + float(mib), 2)
    return out


@dataclass(frozen=True)
class LlamaServerSettings(ServerSettings):
    """``engine.settings`` of ``llama_server``; any knob may also be fixed here (``parallel: 4``)."""

    binary: str | None = None  # llama-server to run (default: PATH, else the cached build)
    port: int = 8080  # the port written into llama-server.sh
    extra_args: list | None = None  # more llama-server flags, passed as they are


def server_argv(binary: str, model_path: str, params: dict[str, Any], port: int,
                model_paths: dict[str, str] | None = None, extra: list | None = None,
                defaults: dict[str, Any] | None = None, n_layers: int | None = None) -> list[str]:
    """llama-server's argv: ``--model``, then each knob whose value is not the server's default.

    Args:
        binary: the llama-server program.
        model_path: the model file.
        params: knob values (``model`` is ignored: it is ``model_path``).
        port: the port bound on 127.0.0.1.
        model_paths: variant name -> file, for ``variant`` knobs (``model_draft``).
        extra: flags appended as they are (``engine.settings.extra_args``).
        defaults: what the server uses without the flag (default: :func:`server_defaults`).
        n_layers: the model's layer count, for the ``exps_last_<N>`` placement.
    """
    base = server_defaults() if defaults is None else defaults
    argv = [str(binary), "--model", str(model_path)]
    base = {**base, "threads_batch": params.get("threads", base.get("threads")),  # follows -t
            "kv_unified": params.get("parallel", base.get("parallel")) == -1}  # on with auto -np
    for knob, (flag, style) in FLAGS.items():
        value = params.get(knob)
        if value is None or (knob in base and value == base[knob]):
            continue
        if style == "switch":
            argv.append(flag if value else "--no-" + flag[2:])
        elif style == "flag":
            argv += [flag] if value else []
        elif style == "placement":
            override = placement_override(value, n_layers)
            argv += [flag, override] if override else []
        elif style == "variant":
            argv += [flag, str((model_paths or {}).get(value, value))]
        else:
            argv += [flag, str(value).lower() if isinstance(value, bool) else str(value)]
    return argv + [str(x) for x in extra or []] + ["--host", HOST, "--port", str(port)]


def model_layers(path: str) -> int | None:
    """The layer count in a GGUF's header (None when the file is not there yet)."""
    from autotune.engines.llamacpp.gguf_memory import gguf_shape

    return gguf_shape(path)["n_layers"] if path and Path(path).is_file() else None


class LlamaServerEngine(GpuSampled, OpenAIServerEngine):
    """``llama-server`` per trial; requests batched in its slots (no concurrency limit here)."""

    name = "llama_server"
    baseline_label = "llama-server's defaults and --fit placement"  # trial 0 runs --fit on
    settings_schema: type = LlamaServerSettings
    predictor = "autotune.engines.llama_server.predict:predict_llama_server"
    presetter, model_formats = "autotune.engines.llama_server.preset:llama_server_preset", ("gguf",)
    context_knob = "ctx_size"
    knobs: dict[str, Knob] = KNOBS
    default_health_path = "/health"
    default_startup_timeout_s = 120.0
    max_concurrency = None

    # ---- driver side: pure -------------------------------------------------------

    @classmethod
    def doctor_checks(cls, model: Path | None = None) -> list[Check]:
        return check_llama_server()

    @classmethod
    def knobs_for(cls, settings: dict) -> dict[str, Knob]:
        return cls.knobs

    @classmethod
    def context_knob_for(cls, settings: dict) -> str | None:
        return cls.context_knob

    @classmethod
    def default_params(cls, settings: dict, variants: dict) -> dict[str, Any]:
        """llama-server's own defaults on this machine (the baseline passes no flag)."""
        model = cls.typed_settings(settings).default_variant or next(iter(variants), None)
        return {"model": model, **server_defaults()}

    @classmethod
    def tie_params(cls, full: dict[str, Any], params: dict, settings: dict) -> dict[str, Any]:
        """``threads_batch`` follows ``threads``, ``kv_unified`` follows ``parallel == -1``,
        unless set themselves (as llama-server does)."""
        if "threads_batch" not in params and "threads_batch" not in settings:
            full["threads_batch"] = full["threads"]
        if "kv_unified" not in params and "kv_unified" not in settings:
            full["kv_unified"] = full["parallel"] == -1
        return full

    @classmethod
    def validate_more(cls, settings: dict, variants: dict, path: str = "engine") -> None:
        if not variants:
            validate_variants(variants, f"{path}.variants")  # llama-server needs a model

    @classmethod
    def preflight(cls, settings: dict, build: bool = True) -> list[str]:
        """Find or build llama-server now (once, cached), before any trial starts; a dry run
        only looks (the plan's launch line then names the build to come)."""
        if not build:
            return super().preflight(settings, build)
        try:
            ensure_binary(cls.typed_settings(settings).binary)
        except BuildError as e:
            return [str(e)]
        return super().preflight(settings)

    @classmethod
    def resources(cls, params: dict, settings: dict) -> Resources:
        num_cpus = cls.typed_settings(settings).num_cpus
        if num_cpus:
            return Resources(num_cpus=float(num_cpus))
        p = cls.full_params(params, settings)
        threads = max(int(p["threads"]), int(p["threads_batch"]), 1)
        return Resources(num_cpus=float(threads))

    @classmethod
    def engine_reasons(cls, params: dict, settings: dict) -> list[str]:
        p = cls.full_params(params, settings)
        reasons = []
        if p.get("cache_type_v") not in UNQUANTIZED_KV and p.get("flash_attn") == "off":
            reasons.append("a quantized V cache (cache_type_v) needs --flash-attn on or auto")
        if p.get("ubatch_size", 0) > p.get("batch_size", 0):
            reasons.append("ubatch_size must be <= batch_size (llama.cpp clamps it silently)")
        if any(v is not None and k in KNOBS and not KNOBS[k].accepts(v) for k, v in p.items()):
            return reasons  # check() names the bad value; no argv is built from it
        argv = server_argv("llama-server", "m.gguf", p, 8080, extra=cls.typed_settings(settings).extra_args,
                           n_layers=1 << 16)
        return reasons + argv_reasons(argv)

    @classmethod
    def argv_for(cls, params: dict, settings: dict, variants: dict, port: int,
                 binary: str | None = None, resolve: bool = True) -> list[str]:
        """The argv of a trial or of the export (one builder for both)."""
        p = cls.full_params(params, settings, variants)
        s = cls.typed_settings(settings)
        paths = {}
        for name in {p.get("model"), p.get("model_draft")} - {None}:
            v = variants.get(name, {})
            paths[name] = str(resolve_variant(name, variants)) if resolve else \
                (v.get("path") or f"<variant {name}>")
        if binary is None:
            found = find_binary(s.binary)
            binary = str(found) if found else "llama-server"
        model = paths.get(p.get("model"), "")
        n_layers = model_layers(model) if str(p.get("override_tensor")).startswith("exps_last_") \
            else None
        return server_argv(binary, model, p, port, paths, s.extra_args,
                           n_layers=n_layers)

    @classmethod
    def describe_launch(cls, params: dict, settings: dict, variants: dict,
                        workload: dict | None = None) -> str:
        line = shlex.join(cls.argv_for(params, settings, variants, 0, resolve=False))
        binary = cls.typed_settings(settings).binary
        if find_binary(binary) is None and not binary:
            line += ("  (llama-server is not built yet: the run builds it once from llama-cpp-python's "
                     "llama.cpp, about 6 min on 2 cores; or now: python -m autotune.engines.llama_server.build)")
        return line

    @classmethod
    def export(cls, params: dict, settings: dict, variants: dict, out_dir: Path) -> list[Path]:
        """``llama-server.sh``: the measured command line, on ``settings.port``."""
        argv = cls.argv_for(params, settings, variants, int(cls.typed_settings(settings).port))
        path = out_dir / "llama-server.sh"
        write_atomic(path, "#!/usr/bin/env sh\n# Winner exported by autotune (engine llama_server)"
                     ": the command line it measured.\nexec " + shlex.join(argv) + "\n")
        path.chmod(0o755)
        return [path]

    @classmethod
    def check_export(cls, files: list[Path]) -> list[str]:
        notes = []
        for f in files:
            if f.name == "llama-server.sh":
                argv = shlex.split(f.read_text().splitlines()[-1].removeprefix("exec "))
                notes += [f"{f.name}: {r}" for r in argv_reasons(argv)]
        return notes

    # ---- worker side -------------------------------------------------------------
    def _argv_env(self, port: int, model_path: str) -> tuple[list[str], dict[str, str]]:
        binary = find_binary(self.opts.binary)  # built by preflight, never in a trial
        if binary is None:
            raise RuntimeError("no llama-server: set engine.settings.binary, put one on PATH or "
                               "run `python -m autotune.engines.llama_server.build`")
        self.info["binary"] = str(binary)
        argv = self.argv_for(self.params, self.settings, self.variants, port, str(binary))
        return argv, {k: str(v) for k, v in self.opts.env.items()}

    def _startup_failed(self, error: Exception) -> Exception:
        """OOM in the log: infeasible; else the server's own error line."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        if OOM.search(text):
            line = next(x for x in text.splitlines() if OOM.search(x))
            return InfeasibleConfig(f"llama-server ran out of memory: {line.strip()}")
        if NO_CONTEXT.search(text):
            return InfeasibleConfig(f"llama-server refused the configuration: {refusal_cause(text)}")
        lines = [x.strip() for x in text.splitlines() if ERROR_LINE.search(x)]
        if lines:
            return RuntimeError(f"llama-server failed: {lines[-1]} ({error})"[:600])
        return error

    def start(self) -> None:
        super().start()  # GpuSampled: per-GPU peak (with NVML) from before the load; spill reads it
        from autotune.engines._openai_stream import get_json

        try:
            props = get_json(self.base_url, "/props")
            self.info["server_props"] = {
                "total_slots": props.get("total_slots"),
                "n_ctx": (props.get("default_generation_settings") or {}).get("n_ctx"),
                "build_info": props.get("build_info"),
            }
        except Exception as e:  # noqa: BLE001 - /props is informative only
            self.info["server_props_error"] = f"{type(e).__name__}: {e}"

    def memory(self) -> dict[str, float]:
        """NVML's peak (GpuSampled) and the server's own buffer sizes (``info.server_buffers_mib``)."""
        out = super().memory()
        log = getattr(self, "log_path", None)
        if log is not None and log.exists():
            buffers = server_buffers(log.read_text(errors="replace"))
            if buffers:
                self.info["server_buffers_mib"] = buffers
        return out

    def generate(self, prompt: str, max_tokens: int, ignore_eos: bool = True):
        try:
            return super().generate(prompt, max_tokens, ignore_eos)
        except Exception as e:
            if self.proc is not None and self.proc.poll() is not None:
                text = self.log_path.read_text(errors="replace")
                if OOM.search(text):
                    raise InfeasibleConfig(f"llama-server ran out of memory while decoding: {e}") from e
            raise
