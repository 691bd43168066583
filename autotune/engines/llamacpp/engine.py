"""llama.cpp through llama-cpp-python, in-process in the trial worker (one request at a time).

Knob spellings follow ``llama_cpp.Llama`` (ENGINE_KNOBS.md §4.1); the export writes the same
configuration as ``Llama(...)`` keyword arguments and as a ``llama-server`` command. Speculative
decoding is llama-cpp-python's prompt-lookup drafter (``draft: prompt_lookup``, ``draft_k``);
:meth:`LlamaCppEngine.measure` then re-generates the measured prompts greedily without it and
reports ``greedy_match`` (1.0 when every token id is identical; mismatches in
``engine.info["greedy_mismatch"]``). Before loading, model + KV memory is estimated from the GGUF
header (``mem_estimate_mb``); with ``n_gpu_layers > 0`` NVML samples VRAM (``vram_peak_gb``).
"""
from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import ClassVar

from autotune._files import write_atomic
from autotune.engines.base import Engine
from autotune.engines.base import EngineSettings
from autotune.engines.base import Knob
from autotune.engines.base import Resources
from autotune.engines.doctor import Check
from autotune.engines.llamacpp import doctor
from autotune.engines.llamacpp.gguf_memory import estimate_llamacpp_mb
from autotune.engines.llamacpp.gguf_memory import peak_rss_mb
from autotune.engines.llamacpp.gpu import decode_failure_reason
from autotune.engines.llamacpp.gpu import fa_pair_reasons
from autotune.engines.llamacpp.gpu import load_failure_reason
from autotune.engines.llamacpp.gpu import visible_count
from autotune.engines.llamacpp.gpu import visible_split
from autotune.engines.variants import resolve_variant
from autotune.engines.variants import validate_variants
from autotune.errors import InfeasibleConfig
from autotune.hardware import VramSampler
from autotune.hardware import cpu_count
from autotune.hardware import pci_bus_order_env
from autotune.measure.types import Generation

KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "q4_0": 2, "q4_1": 3, "iq4_nl": 20, "q5_0": 6, "q5_1": 7}
UNQUANTIZED_KV = ("f32", "f16")
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}  # LLAMA_SPLIT_MODE_*, -sm
GPU_KNOBS = ("n_gpu_layers", "split_mode", "tensor_split", "main_gpu")


@dataclass(frozen=True)
class LlamaCppSettings(EngineSettings):
    """``engine.settings`` of llama.cpp; any knob may also be fixed here (``n_ctx: 2048``)."""

    default_variant: str | None = None  # the baseline's model (default: the first variant)
    seed: int = 0  # Llama(seed=...)
    verbose: bool = False  # llama.cpp's own log (shows why a context cannot be created)
    port: int = 8080  # the port written into llama-server.sh
    cache_hint: str | None = None  # where made variants live, for the export's note
    cuda_fa_all_quants: bool = False  # the build has every quantized-KV flash-attn kernel (docs/gpu.md)


class LlamaCppEngine(Engine):
    """llama-cpp-python ``Llama``; one model instance per trial, greedy decoding."""

    name = "llamacpp"
    predictor = "autotune.engines.llamacpp.predict:predict_llamacpp"
    presetter, model_formats = "autotune.engines.llamacpp.preset:init_preset", ("gguf",)
    context_knob = "n_ctx"
    settings_schema = LlamaCppSettings
    max_concurrency: ClassVar[int] = 1  # one in-process Llama: no batching of requests
    # logprobs() loads the variant with the trial's K/V types and attention at n_ctx =
    # quality.n_tokens. flash_attn moves gemma-3 270M's perplexity by 0.49% (logits by up to
    # 10.7); threads and batch sizes leave the logits bit-identical (measured on 0.3.36, CPU);
    # the prompt-lookup draft is not used there
    quality_knobs: ClassVar[tuple[str, ...]] = ("model", "type_k", "type_v", "flash_attn")
    knobs = {
        "model": Knob("str", doc="model variant name (engine.variants)"),
        "n_threads": Knob("int", low=1, high=512, spelling="n_threads / -t"),
        "n_threads_batch": Knob("int", low=1, high=512, spelling="n_threads_batch / -tb"),
        "n_batch": Knob("int", low=1, high=65536, spelling="n_batch / -b"),
        "n_ubatch": Knob("int", low=1, high=65536, spelling="n_ubatch / -ub"),
        "n_ctx": Knob("int", low=0, high=1 << 20, spelling="n_ctx / -c"),
        "flash_attn": Knob("bool", spelling="flash_attn / -fa"),
        "type_k": Knob("str", tuple(KV_TYPES), spelling="type_k / -ctk"),
        "type_v": Knob("str", tuple(KV_TYPES), spelling="type_v / -ctv"),
        "use_mmap": Knob("bool", spelling="use_mmap / --no-mmap"),
        "use_mlock": Knob("bool", spelling="use_mlock / --mlock"),
        "offload_kqv": Knob("bool", spelling="offload_kqv / -nkvo"),
        "n_gpu_layers": Knob("int", low=-1, high=100000, spelling="n_gpu_layers / -ngl"),
        "split_mode": Knob("str", tuple(SPLIT_MODES), spelling="split_mode / -sm"),
        "tensor_split": Knob("list", spelling="tensor_split / -ts"),
        "main_gpu": Knob("int", low=0, high=64, spelling="main_gpu / -mg"),
        "draft": Knob("str", ("none", "prompt_lookup"), doc="speculative drafter"),
        "draft_k": Knob("int", low=1, high=64, spelling="LlamaPromptLookupDecoding(num_pred_tokens)"),
        "draft_ngram": Knob("int", low=1, high=16, spelling="LlamaPromptLookupDecoding(max_ngram_size)"),
        "logits_all": Knob("bool", spelling="logits_all"),
        "prefix_cache": Knob("bool", doc="reuse the KV of the previous request's common prefix "
                             "(multi-turn chats; llama-server's prompt cache)"),
    }

    @classmethod
    def doctor_checks(cls, model: Path | None = None) -> list[Check]:
        return doctor.doctor_checks(model)

    @classmethod
    def gate_checks(cls, settings: dict, space: dict) -> list[Check]:
        return doctor.gate_checks(wants_gpu="n_gpu_layers" in space or bool(settings.get("n_gpu_layers")))

    @classmethod
    def default_params(cls, settings: dict, variants: dict) -> dict[str, Any]:
        n = cpu_count()
        return {
            "model": cls.typed_settings(settings).default_variant or next(iter(variants), None),
            "n_threads": max(n // 2, 1), "n_threads_batch": n, "n_batch": 512, "n_ubatch": 512,
            "n_ctx": 512, "flash_attn": False, "type_k": "f16", "type_v": "f16",
            "use_mmap": True, "use_mlock": False, "offload_kqv": True, "n_gpu_layers": 0,
            "split_mode": "layer", "tensor_split": None, "main_gpu": 0, "draft": "none",
            "draft_k": 10, "draft_ngram": 2, "logits_all": False, "prefix_cache": False,
        }

    @classmethod
    def validate_more(cls, settings: dict, variants: dict, path: str = "engine") -> None:
        if not variants:
            validate_variants(variants, f"{path}.variants")  # llama.cpp needs a model

    @classmethod
    def tie_params(cls, full: dict[str, Any], params: dict, settings: dict) -> dict[str, Any]:
        """``n_threads_batch`` follows a searched ``n_threads`` unless it is set itself."""
        if "n_threads_batch" not in params and "n_threads_batch" not in settings and "n_threads" in params:
            full["n_threads_batch"] = full["n_threads"]
        return full

    @classmethod
    def resources(cls, params: dict, settings: dict) -> Resources:
        p = cls.full_params(params, settings)
        gpus = 0.0
        if p.get("n_gpu_layers"):
            split = p.get("tensor_split")
            gpus = float(len([x for x in split if x])) if split else 1.0
        return Resources(num_cpus=float(max(p["n_threads"], p["n_threads_batch"])), num_gpus=gpus)

    @classmethod
    def engine_reasons(cls, params: dict, settings: dict) -> list[str]:
        p = cls.full_params(params, settings)
        reasons = []
        if p.get("type_v") not in UNQUANTIZED_KV and not p.get("flash_attn"):
            reasons.append("a quantized V cache (type_v) needs flash_attn=true in llama.cpp")
        if p.get("n_ubatch", 0) > p.get("n_batch", 0):
            reasons.append("n_ubatch must be <= n_batch (llama.cpp clamps it silently)")
        return reasons + fa_pair_reasons(p, cls.typed_settings(settings).cuda_fa_all_quants)

    # ---- export ---------------------------------------------------------------------
    @classmethod
    def llama_kwargs(cls, params: dict, settings: dict, variants: dict, model_path: str) -> dict:
        p = cls.full_params(params, settings, variants)
        kw: dict[str, Any] = {
            "model_path": model_path, "n_threads": p["n_threads"], "n_threads_batch": p["n_threads_batch"],
            "n_batch": p["n_batch"], "n_ubatch": p["n_ubatch"], "n_ctx": p["n_ctx"],
            "flash_attn": p["flash_attn"], "type_k": KV_TYPES[p["type_k"]], "type_v": KV_TYPES[p["type_v"]],
            "use_mmap": p["use_mmap"], "use_mlock": p["use_mlock"], "offload_kqv": p["offload_kqv"],
            "n_gpu_layers": p["n_gpu_layers"], "seed": int(cls.typed_settings(settings).seed),
            "logits_all": p["logits_all"] or p["draft"] != "none",
        }
        if p["n_gpu_layers"]:
            kw["split_mode"] = SPLIT_MODES[p["split_mode"]]
            kw["main_gpu"] = p["main_gpu"]
            if p.get("tensor_split"):
                kw["tensor_split"] = list(p["tensor_split"])
        return kw

    @classmethod
    def server_argv(cls, params: dict, settings: dict, variants: dict, model_path: str) -> list[str]:
        """The equivalent ``llama-server`` argv (newest flag spellings, ENGINE_KNOBS §4.3)."""
        from autotune.engines.llamacpp.export import server_argv

        return server_argv(cls.full_params(params, settings, variants), model_path,
                           cls.typed_settings(settings).port)

    @classmethod
    def export(cls, params: dict, settings: dict, variants: dict, out_dir: Path) -> list[Path]:
        v = variants[cls.full_params(params, settings, variants)["model"]]
        model_path = v.get("path") or f"<variant {cls.full_params(params, settings, variants)['model']}: {json.dumps(v)}>"
        kwargs = cls.llama_kwargs(params, settings, variants, model_path)
        argv = cls.server_argv(params, settings, variants, model_path)
        note = ""
        if "path" not in v:
            note = ("# The model is made by autotune (see engine.variants in best.yaml); its file\n"
                    f"# is in {cls.typed_settings(settings).cache_hint or '~/.cache/autotune/models'}.\n")
        kw_path, sh_path = out_dir / "llama_cpp_kwargs.json", out_dir / "llama-server.sh"
        write_atomic(kw_path, json.dumps(kwargs, indent=2) + "\n")
        write_atomic(sh_path, "#!/usr/bin/env sh\n# Winner exported by autotune.\n" + note + shlex.join(argv) + "\n")
        sh_path.chmod(0o755)
        return [kw_path, sh_path]

    @classmethod
    def check_export(cls, files: list[Path]) -> list[str]:
        """llama-server.sh's flags and model, llama_cpp_kwargs.json's model_path."""
        from autotune.engines.llamacpp.export import check_llama_files

        return check_llama_files(files)

    # ---- worker side ----------------------------------------------------------------
    def _load(self, logits_all: bool = False, n_ctx: int | None = None):
        import llama_cpp

        p = self.full_params(self.params, self.settings, self.variants)
        if any(p.get(k) for k in ("n_gpu_layers",)) and not llama_cpp.llama_supports_gpu_offload():
            raise InfeasibleConfig(
                f"n_gpu_layers={p['n_gpu_layers']} asks for GPU offload, but this llama-cpp-python "
                "build has no GPU backend (reinstall with CMAKE_ARGS=-DGGML_CUDA=on)"
            )
        for reason in self.check(self.params, self.settings):
            raise InfeasibleConfig(reason)
        kw = self.llama_kwargs(self.params, self.settings, self.variants, str(self.model_path))
        if kw["n_gpu_layers"]:
            try:  # the trial sees its GPUs as 0..n-1 (CUDA_VISIBLE_DEVICES)
                split, kw["main_gpu"], note = visible_split(kw.get("tensor_split"), kw["main_gpu"], visible_count())
            except ValueError as e:
                raise InfeasibleConfig(str(e)) from e
            if split is not None:
                kw["tensor_split"] = split
            if note:
                self.info["gpu_renumbered"] = note
        if logits_all:
            kw["logits_all"] = True
        if n_ctx:
            kw["n_ctx"] = max(kw["n_ctx"], n_ctx)
        if p["draft"] == "prompt_lookup" and not logits_all:
            # logits_all=True is already in kw: without it 0.3.36 crashes past n_batch.
            kw["draft_model"] = _counting_drafter(p["draft_ngram"], p["draft_k"])
        kw["verbose"] = bool(self.opts.verbose)
        try:
            return llama_cpp.Llama(**kw)
        except ValueError as e:  # infeasible, or a real failure such as a wrong model path
            reason = load_failure_reason(e, bool(kw["n_gpu_layers"]))
            if reason is None:
                raise
            raise InfeasibleConfig(reason) from e

    def start(self) -> None:
        p = self.full_params(self.params, self.settings, self.variants)
        self.model_path = resolve_variant(p["model"], self.variants)
        self.info["model_path"] = str(self.model_path)
        self._vram = None
        self._estimate: dict | None = None
        kw = self.llama_kwargs(self.params, self.settings, self.variants, str(self.model_path))
        try:
            self._estimate = estimate_llamacpp_mb(
                self.model_path, kw["n_ctx"], p["type_k"], p["type_v"],
                n_ubatch=p["n_ubatch"], logits_all=kw["logits_all"],
            )
            self.info["mem_estimate"] = {
                k: v for k, v in self._estimate.items() if k.endswith("_mb") or k == "n_ctx"
            }
        except Exception as e:  # noqa: BLE001 - an estimate must never fail a trial
            self.info["mem_estimate_error"] = f"{type(e).__name__}: {e}"
        if p["n_gpu_layers"]:
            os.environ.update(pci_bus_order_env())  # before CUDA starts: number GPUs as NVML does
            self._vram = VramSampler().__enter__()
        self.llm = self._load()
        self._prefix_cache = bool(p.get("prefix_cache"))

    def generate(self, prompt: str, max_tokens: int, ignore_eos: bool = True) -> Generation:
        llm = self.llm
        tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)
        # llama.cpp may pad its context (64 -> 256) but the Python token buffer keeps n_ctx
        n_ctx = min(llm.n_ctx(), len(llm.input_ids))
        if len(tokens) + max_tokens > n_ctx:
            raise InfeasibleConfig(
                f"n_ctx={n_ctx} is too small for a {len(tokens)}-token prompt + "
                f"{max_tokens} new tokens"
            )
        if not getattr(self, "_prefix_cache", False):
            llm.reset()  # n_tokens = 0: generate() then reuses no cached prefix
        drafter = llm.draft_model
        if drafter is not None:
            drafter.calls = drafter.drafted = 0
        eos = llm.token_eos()
        out: list[int] = []
        times: list[float] = []
        t0 = time.perf_counter()
        greedy = {"top_k": 1, "top_p": 1.0, "min_p": 0.0, "temp": 0.0, "repeat_penalty": 1.0}
        try:
            for tok in llm.generate(tokens, reset=True, **greedy):
                times.append(time.perf_counter() - t0)
                if tok == eos and not ignore_eos:
                    break
                out.append(tok)
                if len(out) >= max_tokens:
                    break
        except RuntimeError as e:  # llama_decode returned N: out of memory is infeasible
            reason = decode_failure_reason(e)
            if reason is None:
                raise
            raise InfeasibleConfig(reason) from e
        e2e = time.perf_counter() - t0
        text = llm.detokenize(out).decode("utf-8", "replace")
        gen = Generation(len(tokens), len(out), times[: len(out)] or times, e2e, text, out)
        if drafter is not None:
            # each drafter call is followed by one eval that yields 1 + accepted tokens
            gen.drafted = drafter.drafted
            gen.accepted = max(0, len(out) - 1 - drafter.calls)
        return gen

    def measure(self, workload: dict) -> tuple[dict[str, float], dict]:
        """The shared timing loop, plus the greedy-output check when a drafter is on.

        A context ladder or an SLO load search runs in the form it declares (the greedy check
        needs one fixed run of prompts, so it is made only there).
        """
        from autotune.measure.levels import as_workload
        from autotune.measure.workload import collect
        from autotune.measure.workload import run_workload
        from autotune.measure.workload import summarize_run

        wl = as_workload(workload)
        if wl.context_ladder or wl.load == "slo":
            return run_workload(self, wl)
        run = collect(self, wl)
        metrics, raw = summarize_run(run)
        metrics["greedy_match"] = self._greedy_match(run) if self.llm.draft_model else 1.0
        return metrics, raw

    def _greedy_match(self, run) -> float:
        """Re-generate the measured prompts without the drafter; 1.0 if all ids match."""
        llm = self.llm
        drafter, llm.draft_model = llm.draft_model, None
        mismatches = []
        try:
            seen: dict[str, list[int]] = {}
            for i, (prompt, gen) in enumerate(zip(run.prompts, run.gens, strict=True)):
                if prompt not in seen:
                    seen[prompt] = self.generate(prompt, run.max_tokens, run.ignore_eos).token_ids
                plain = seen[prompt]
                if plain != gen.token_ids:
                    pairs = enumerate(zip(plain, gen.token_ids, strict=False))
                    pos = next((j for j, (a, b) in pairs if a != b),
                               min(len(plain), len(gen.token_ids)))
                    mismatches.append({
                        "request": i, "position": pos, "n_plain": len(plain),
                        "n_speculative": len(gen.token_ids),
                        "plain": plain[pos : pos + 5], "speculative": gen.token_ids[pos : pos + 5],
                    })
        finally:
            llm.draft_model = drafter
        self.info["greedy_checked"] = len(run.gens)
        self.info["greedy_mismatch"] = mismatches
        return 0.0 if mismatches else 1.0

    def logprobs(self, text: str, n_tokens: int):
        self.llm = None  # free the speed instance before allocating all-token logits
        llm = self._load(logits_all=True, n_ctx=n_tokens)
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)[:n_tokens]
        llm.reset()
        llm.eval(tokens)
        self._quality_llm = llm
        return tokens, llm.scores[: len(tokens)]

    def memory(self) -> dict[str, float]:
        out = {"peak_rss_mb": peak_rss_mb()}
        if self._estimate is not None:
            out["mem_estimate_mb"] = self._estimate["total_mb"]
        if self._vram is not None:
            out.update(self._vram.metrics())
            self.info.update(vram_per_gpu_gb=dict(self._vram.per_gpu), vram_free_per_gpu_gb=dict(self._vram.free))
        return out

    def stop(self) -> None:
        self.llm = None
        self._quality_llm = None
        if getattr(self, "_vram", None) is not None:
            self._vram.__exit__(None, None, None)
            self._vram = None


def _counting_drafter(max_ngram_size: int, num_pred_tokens: int):
    """A prompt-lookup drafter that counts its calls and proposed tokens."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    class CountingPromptLookup(LlamaPromptLookupDecoding):
        calls = 0
        drafted = 0

        def __call__(self, input_ids, /, **kwargs):
            draft = super().__call__(input_ids, **kwargs)
            self.calls += 1
            self.drafted += len(draft)
            return draft

    return CountingPromptLookup(max_ngram_size=max_ngram_size, num_pred_tokens=num_pred_tokens)
