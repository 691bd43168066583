"""ExLlamaV2 0.3.2 in the trial worker (GPU only), and its TabbyAPI export: ``kind: exllamav2``.

Knob spellings and the load recipe follow ENGINE_KNOBS.md §1 (exllamav2) and §2 (TabbyAPI,
exl2-checkpoint branch, the last that drives exllamav2). ``gpu_split`` is ``"auto"``
(autosplit with ``autosplit_reserve_mb`` on GPU 0), ``"tp"`` (tensor parallel, balanced by
free VRAM) or GB per GPU (a list, or ``"30,26"`` as an Optuna-friendly string).
Timing comes from the arrival of the dynamic generator's streamed results (one pump thread,
:mod:`autotune.engines.exllamav2.pump`): TTFT is the arrival of the first token, the spacing of
the results gives the decode rate. The generator runs paged (batched; needs flash-attn >= 2.5.7)
or, as TabbyAPI without flash-attn, non-paged with batch size 1 (knob ``paged``; auto by
default; ``info.generator_mode`` says which ran). The CUDA extension is built in the
pre-flight (:mod:`autotune.engines.cuda_ext`). See docs/gpu.md. ``layer_skip_threshold`` is seed
001's method: layers of the middle half whose output hidden state has a cosine similarity
above the threshold with their input are removed from ``model.modules`` (§1.4).

The pure parts (:func:`load_plan`, :func:`split_reasons`, :func:`tabby_config`,
:func:`tabby_warnings`, :func:`skip_candidates`, :func:`filter_modules`) import nothing
from exllamav2 or torch, so they run and are tested on CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from autotune.engines.base import Engine
from autotune.engines.base import EngineSettings
from autotune.engines.base import Knob
from autotune.engines.base import Resources
from autotune.engines.cuda_ext import EXLLAMAV2
from autotune.engines.doctor import Check
from autotune.engines.doctor import check_exllama
from autotune.engines.exllamav2.plan import CACHE_CLASSES  # noqa: F401
from autotune.engines.exllamav2.plan import CACHE_MODES  # noqa: F401
from autotune.engines.exllamav2.plan import MAX_Q_SIZE  # noqa: F401
from autotune.engines.exllamav2.plan import PAGE  # noqa: F401
from autotune.engines.exllamav2.plan import TABBY_DRAFT_K  # noqa: F401
from autotune.engines.exllamav2.plan import _dir_name  # noqa: F401
from autotune.engines.exllamav2.plan import choose_paged
from autotune.engines.exllamav2.plan import clamp_chunk
from autotune.engines.exllamav2.plan import failure_reason
from autotune.engines.exllamav2.plan import filter_modules  # noqa: F401
from autotune.engines.exllamav2.plan import gpus_of  # noqa: F401
from autotune.engines.exllamav2.plan import job_args
from autotune.engines.exllamav2.plan import load_plan  # noqa: F401
from autotune.engines.exllamav2.plan import mode_warnings
from autotune.engines.exllamav2.plan import parse_split  # noqa: F401
from autotune.engines.exllamav2.plan import reserve_vram
from autotune.engines.exllamav2.plan import round_up  # noqa: F401
from autotune.engines.exllamav2.plan import select_skips  # noqa: F401
from autotune.engines.exllamav2.plan import skip_candidates  # noqa: F401
from autotune.engines.exllamav2.plan import split_reasons  # noqa: F401
from autotune.engines.exllamav2.plan import tabby_config  # noqa: F401
from autotune.engines.exllamav2.plan import tabby_load_forward
from autotune.engines.exllamav2.plan import tabby_warnings  # noqa: F401
from autotune.engines.exllamav2.plan import tabby_yaml  # noqa: F401
from autotune.engines.exllamav2.plan import validate_gpu_settings
from autotune.engines.exllamav2.pump import JobPump
from autotune.engines.exllamav2.pump import PumpFailed
from autotune.errors import InfeasibleConfig
from autotune.hardware import VramSampler
from autotune.hardware import pci_bus_order_env
from autotune.measure.types import Generation


@dataclass(frozen=True)
class ExLlamaV2Settings(EngineSettings):
    """``engine.settings`` of ExLlamaV2 (``gpus``: the resource plan); knobs may be fixed here."""

    default_variant: str | None = None  # the baseline's model (default: the first variant)
    defaults: dict = field(default_factory=dict)  # the baseline (trial 0) over the engine defaults
    num_cpus: float = 1.0  # Ray CPUs per trial
    calibration_text: str = "gpl3"  # layer skipping: cosine similarity measured on this text
    calibration_tokens: int = 128
    request_timeout_s: float = 600.0  # one request's wait for its results
    export_port: int | None = None  # the port written into tabbyapi.yml
    build_extension: bool = True  # build the CUDA extension in the pre-flight
    extension_build_timeout_s: float = 1800.0


class ExLlamaV2Engine(Engine):
    """ExLlamaV2 with the dynamic generator, in-process in the trial worker (CUDA only).

    ``generate`` is thread-safe: jobs are enqueued under a lock and one pump thread runs
    ``generator.iterate()``, so concurrent requests are batched by the generator.
    """

    name = "exllamav2"
    package_fix = "pip install 'autotune[gpu]'"
    needs_gpu = True
    predictor = "autotune.engines.exllamav2.predict:predict_exllamav2"
    presetter, model_formats = "autotune.engines.exllamav2.preset:init_preset", ("exl2",)
    context_knob = "max_seq_len"
    cuda_kernels = EXLLAMAV2  # built in the pre-flight, outside any trial
    settings_schema = ExLlamaV2Settings
    # logprobs() runs the variant through the trial's cache (its mode, and its length, which
    # cuts the quality text), skipping the layers the threshold skips; the draft model is not used
    quality_knobs = ("model", "cache_mode", "layer_skip_threshold", "max_seq_len", "cache_size")
    knobs = {
        "model": Knob("str", doc="EXL2 variant (engine.variants: path + bpw)"),
        "max_seq_len": Knob("int", low=256, high=1 << 20, spelling="config.max_seq_len / max_seq_len"),
        "cache_size": Knob("int", low=256, high=1 << 22, spelling="cache max_seq_len / cache_size"),
        "cache_mode": Knob("str", CACHE_MODES, spelling="ExLlamaV2Cache[_Q8|_Q6|_Q4] / cache_mode"),
        "gpu_split": Knob("str|list", doc="auto | tp | GB per GPU ('30,26' or a list)", spelling="gpu_split"),
        "autosplit_reserve_mb": Knob("int", low=0, high=1 << 16, spelling="reserve_vram / autosplit_reserve"),
        "chunk_size": Knob("int", low=PAGE, high=1 << 16, spelling="max_input_len / chunk_size"),
        "max_batch_size": Knob("int", low=1, high=1024, spelling="max_batch_size"),
        "draft_model": Knob("str", doc="draft variant name or none", spelling="draft_model_name"),
        "draft_cache_mode": Knob("str", CACHE_MODES, spelling="draft_cache_mode"),
        "num_draft_tokens": Knob("int", low=1, high=MAX_Q_SIZE, spelling="num_draft_tokens"),
        "layer_skip_threshold": Knob("float", low=0.0, high=1.0, doc="cosine threshold; 1 = off"),
        "paged": Knob("bool", doc="paged generator (needs flash-attn); unset = paged when available",
                      spelling="ExLlamaV2DynamicGenerator(paged=...)"),
    }

    @classmethod
    def doctor_checks(cls, model: Path | None = None) -> list[Check]:
        return check_exllama()

    @classmethod
    def default_params(cls, settings: dict, variants: dict) -> dict[str, Any]:
        s = cls.typed_settings(settings)
        out = {
            "model": s.default_variant or next(iter(variants), None),
            "max_seq_len": 4096, "cache_size": None, "cache_mode": "FP16", "gpu_split": "auto",
            "autosplit_reserve_mb": 96, "chunk_size": 2048, "max_batch_size": None,
            "draft_model": "none", "draft_cache_mode": "FP16", "num_draft_tokens": 4,
            "layer_skip_threshold": 1.0,
        }
        return {**out, **s.defaults}

    @classmethod
    def validate_more(cls, settings: dict, variants: dict, path: str = "engine") -> None:
        validate_gpu_settings(settings, variants, path)

    @classmethod
    def resources(cls, params: dict, settings: dict) -> Resources:
        p = cls.full_params(params, settings)
        mode, split = parse_split(p["gpu_split"])
        n = len(split) if mode == "manual" else max(len(gpus_of(settings)), 1)
        return Resources(num_cpus=float(cls.typed_settings(settings).num_cpus), num_gpus=float(n))

    @classmethod
    def engine_reasons(cls, params: dict, settings: dict) -> list[str]:
        p = cls.full_params(params, settings)
        reasons: list[str] = []
        try:
            mode, split = parse_split(p["gpu_split"])
        except ValueError as e:
            return reasons + [str(e)]
        gpus = gpus_of(settings)
        if mode == "manual":
            reasons += split_reasons(split, gpus)
        if mode == "tp" and gpus and len(gpus) < 2:
            reasons.append("gpu_split=tp needs at least 2 GPUs")
        if p["chunk_size"] % PAGE:
            reasons.append(f"chunk_size={p['chunk_size']} must be a multiple of {PAGE}")
        if p.get("cache_size") and p["cache_size"] < p["max_seq_len"]:
            reasons.append(f"cache_size={p['cache_size']} < max_seq_len={p['max_seq_len']}")
        if p.get("paged") is False and (p.get("max_batch_size") or 1) > 1:
            reasons.append("max_batch_size > 1 needs paged=true (non-paged runs one job at a time)")
        if p.get("max_batch_size") and p["max_batch_size"] * MAX_Q_SIZE > clamp_chunk(p["chunk_size"], p["max_seq_len"]):
            reasons.append(f"max_batch_size*{MAX_Q_SIZE} must be <= chunk_size (exllamav2 generator limit)")
        skip = p.get("layer_skip_threshold")
        if skip is not None and skip < 1.0 and mode == "tp":
            reasons.append("layer skipping is not supported with tensor parallel loading")
        return reasons

    @classmethod
    def export_warnings(cls, params: dict, settings: dict) -> list[str]:
        p = cls.full_params(params, settings)
        return tabby_warnings(p, settings) + mode_warnings(p)

    @classmethod
    def export(cls, params: dict, settings: dict, variants: dict, out_dir: Path) -> list[Path]:
        from autotune.engines.tabbyapi.check import write_tabby_files

        p = cls.full_params(params, settings, variants)
        return write_tabby_files(out_dir, tabby_yaml(p, settings, variants), tabby_warnings(p, settings))

    @classmethod
    def check_export(cls, files: list[Path]) -> list[str]:
        """tabbyapi.yml against TabbyAPI exl2-checkpoint's config model (tabbyapi.schema_exl2)."""
        from autotune.engines.tabbyapi.check import check_tabby_files

        return check_tabby_files(files)

    # ---- worker side (needs CUDA + exllamav2) ----------------------------------------------
    def _load(self, path: Path, plan: dict, cache_class_name: str, draft: bool = False):
        import exllamav2 as ex

        config = ex.ExLlamaV2Config(str(path))
        config.arch_compat_overrides()
        config.max_seq_len = plan["max_seq_len"]
        config.max_input_len = plan["max_input_len"]
        config.max_attention_size = plan["max_attention_size"]
        config.no_graphs = config.no_graphs or plan["no_graphs"]
        if not plan["paged"]:
            config.no_flash_attn = True  # as TabbyAPI in its compatibility mode
        model = ex.ExLlamaV2(config)
        cache_cls = getattr(ex, cache_class_name)
        mode = "auto" if draft else plan["mode"]  # the draft is always autosplit (as TabbyAPI)
        if mode == "tp":
            model.load_tp(plan["gpu_split"] or None, expect_cache_base=cache_cls,
                          expect_cache_tokens=plan["cache_size"])
            cache = ex.ExLlamaV2Cache_TP(model, base=cache_cls, max_seq_len=plan["cache_size"])
        elif mode == "manual":
            model.load(plan["gpu_split"])
            cache = cache_cls(model, max_seq_len=plan["cache_size"], lazy=False)
        else:
            cache = cache_cls(model, max_seq_len=plan["cache_size"], lazy=True)
            model.load_autosplit(cache, reserve_vram=plan["reserve_vram"], last_id_only=True)
        return config, model, cache

    def _paged(self, p: dict, torch) -> bool:
        """Paged mode where flash-attn's paged kernels exist, else non-paged (TabbyAPI's rule)."""
        from exllamav2 import attn

        cc = min(torch.cuda.get_device_capability(i)[0] for i in range(torch.cuda.device_count()))
        try:
            paged, why = choose_paged(p.get("paged"), attn.has_flash_attn_with_paged, cc)
        except ValueError as e:
            raise InfeasibleConfig(str(e)) from e
        self.info["generator_mode"] = why
        return paged

    def start(self) -> None:
        os.environ.update(pci_bus_order_env())  # CUDA numbers GPUs as NVML does (VramSampler)
        import torch

        if not torch.cuda.is_available():
            raise InfeasibleConfig("exllamav2 needs a CUDA GPU; none is visible")
        from autotune.engines.variants import resolve_variant

        for reason in self.check(self.params, self.settings):
            raise InfeasibleConfig(reason)
        p = self.full_params(self.params, self.settings, self.variants)
        self.vram = VramSampler().__enter__()
        import exllamav2 as ex
        from exllamav2.generator import ExLlamaV2DynamicGenerator

        plan = load_plan(p, self.settings, paged=self._paged(p, torch))
        plan["reserve_vram"] = reserve_vram(float(p["autosplit_reserve_mb"]), torch.cuda.device_count())
        self.info["load_plan"] = plan
        draft_model = draft_cache = None
        try:
            if plan["draft"]:
                _, draft_model, draft_cache = self._load(
                    resolve_variant(plan["draft"]["variant"], self.variants), plan,
                    plan["draft"]["cache_class"], draft=True)
            config, self.model, self.cache = self._load(resolve_variant(p["model"], self.variants),
                                                        plan, plan["cache_class"])
            if draft_model is not None:  # as TabbyAPI loads (tabby_load_forward)
                tabby_load_forward(draft_model, draft_cache, plan["max_input_len"], torch)
            tabby_load_forward(self.model, self.cache, plan["max_input_len"], torch)
            self.tokenizer = ex.ExLlamaV2Tokenizer(config)
            if plan["layer_skip_threshold"] is not None and plan["layer_skip_threshold"] < 1.0:
                self._skip_layers(float(plan["layer_skip_threshold"]))
            gen_kw = {k: v for k, v in plan["generator"].items() if v is not None}
            self.generator = ExLlamaV2DynamicGenerator(
                model=self.model, cache=self.cache, tokenizer=self.tokenizer, draft_model=draft_model,
                draft_cache=draft_cache, **gen_kw)
            self.generator.warmup()
        except Exception as e:  # noqa: BLE001 - classified: infeasible (OOM, refused) or failed
            reason = failure_reason(e)
            if reason is None:
                raise
            raise InfeasibleConfig(reason) from e
        self.info["paged"] = plan["paged"]
        self.pump = JobPump(self.generator)
        self.cached_tokens = 0

    def _layer_starts(self) -> list[int]:
        from exllamav2.attn import ExLlamaV2Attention

        starts = [j for j, m in enumerate(self.model.modules) if isinstance(m, ExLlamaV2Attention)]
        return starts + [self.model.head_layer_idx - 1]  # the final norm closes the last layer

    def _skip_layers(self, threshold: float) -> None:
        """Seed 001's calibration: cos(layer input, layer output) on a calibration prompt."""
        import torch

        from autotune.measure.quality import load_text

        starts = self._layer_starts()
        text = load_text(self.opts.calibration_text)
        ids = self.tokenizer.encode(text)[:, : int(self.opts.calibration_tokens)]
        r = self.model.forward_chunk(ids, cache=None, extract_state_indices=starts, last_id_only=True)
        states = [r["states"][j].float() for j in starts]
        sims = [float(torch.nn.functional.cosine_similarity(a.to(b.device), b, dim=-1).mean())
                for a, b in zip(states, states[1:], strict=False)]
        skip = select_skips(sims, threshold)
        self.model.modules, self.model.head_layer_idx, self.model.last_kv_layer_idx = filter_modules(
            self.model.modules, starts, skip)
        self.info.update(layer_similarity=[round(s, 5) for s in sims], skipped_layers=skip,
                         n_layers=len(sims))

    def generate(self, prompt: str, max_tokens: int, ignore_eos: bool = True) -> Generation:
        from exllamav2.generator import ExLlamaV2DynamicJob
        from exllamav2.generator import ExLlamaV2Sampler

        ids = self.tokenizer.encode(prompt, add_bos=True)
        # + num_draft_tokens: a draft job stops K tokens short of max_new_tokens (plan.job_args)
        args = job_args(max_tokens, ignore_eos, getattr(self.generator, "num_draft_tokens", 0),
                        self.tokenizer.eos_token_id)

        def job(ident: int):
            return ExLlamaV2DynamicJob(input_ids=ids, gen_settings=ExLlamaV2Sampler.Settings.greedy(),
                                       identifier=ident, **args)

        try:
            ident, t0, q = self.pump.submit(job)
            results = list(self.pump.results(ident, q, float(self.opts.request_timeout_s)))
        except PumpFailed as e:  # iterate() raised in the pump thread: fail now, with its reason
            reason = failure_reason(e.cause)
            if reason is None:
                raise
            raise InfeasibleConfig(reason) from e.cause
        gen, cached = generation_from_results(results, t0, ids.shape[-1])
        self.cached_tokens += cached
        self.info["cached_tokens"] = self.cached_tokens  # prefix reuse across requests (TTFT!)
        return gen

    def logprobs(self, text: str, n_tokens: int):
        """Logits of every position, forwarded in chunks of at most ``max_input_len``.

        ``model.forward`` without a cache asserts ``q_len <= max_input_len``; with the trial's
        cache it splits the input into such chunks (``exllamav2/model.py::forward``).
        """
        import torch

        ids = self.tokenizer.encode(text, add_bos=True)[:, : min(n_tokens, self.cache.max_seq_len)]
        self.cache.current_seq_len = 0
        with torch.inference_mode():
            logits = self.model.forward(ids, cache=self.cache, last_id_only=False)
        self.cache.current_seq_len = 0
        if getattr(self, "generator", None) is not None:
            self.generator.reset_page_table()  # the pages now hold this text, not the cached prefixes
        return ids[0].tolist(), logits[0].float().cpu().numpy()

    def memory(self) -> dict[str, float]:
        vram = getattr(self, "vram", None)
        if vram is None:
            return {}
        self.info.update(vram_per_gpu_gb=dict(vram.per_gpu), vram_free_per_gpu_gb=dict(vram.free))
        return vram.metrics()

    def stop(self) -> None:
        if getattr(self, "pump", None) is not None:
            self.pump.close()
            self.pump = None
        for attr in ("generator", "cache", "model", "tokenizer"):
            setattr(self, attr, None)
        if getattr(self, "vram", None) is not None:
            self.vram.__exit__(None, None, None)
        try:
            import torch

            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass


def generation_from_results(results: list[tuple[float, dict]], t0: float, n_prompt: int) -> tuple[Generation, int]:
    """A Generation from one job's timed results (``ExLlamaV2DynamicGenerator.iterate``), and its cached tokens.

    TTFT is the arrival of the first streamed token, measured from submit: the generator's
    ``time_enqueued + time_prefill`` stops before the forward pass that yields the first token
    (prefill covers all but the last prompt token; with a draft model, K draft passes follow).
    """
    arrivals = [now - t0 for now, r in results
                if r.get("stage") == "streaming" and (r.get("text") or r.get("token_ids") is not None)]
    text = "".join(r.get("text", "") for _, r in results if r.get("stage") == "streaming")
    last = results[-1][1] if results else {}
    e2e = (results[-1][0] - t0) if results else 0.0
    accepted = int(last.get("accepted_draft_tokens", 0))
    rejected = int(last.get("rejected_draft_tokens", 0))
    gen = Generation(int(last.get("prompt_tokens", n_prompt)), int(last.get("new_tokens", 0)), arrivals,
                     e2e, text, drafted=accepted + rejected, accepted=accepted)
    return gen, int(last.get("cached_tokens", 0))
