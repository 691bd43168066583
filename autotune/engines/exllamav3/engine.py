"""ExLlamaV3 (1.6.x) in the trial worker (GPU only), and its TabbyAPI main export: ``kind: exllamav3``.

The knobs are TabbyAPI main's ``config.yml`` keys (``cache_mode: "8,8"``, ``tensor_parallel``,
``tensor_parallel_backend``, ``gpu_split``, ``autosplit_reserve``, ``chunk_size``,
``max_batch_size``, ``draft_model``, ``draft_mode``, ``draft_num_tokens``...) and the load
follows TabbyAPI main's exllamav3 backend (:mod:`autotune.engines.exllamav3.plan`): the
winner's ``tabbyapi.yml`` loads what was measured. Timing comes from the streamed results
of exllamav3's ``Generator`` driven by the same one-thread pump as ExLlamaV2
(:class:`autotune.engines.exllamav2.pump.JobPump`: ``enqueue``/``iterate``/
``num_remaining_jobs`` are the same in both libraries).

exllamav3 and torch are imported only in :meth:`ExLlamaV3Engine.start`; everything the
driver calls is pure and runs on CPU. No flash-attn is needed (exllamav3 has its own
attention kernels): they compile on first import, for minutes (over 5 on an H200 with 16
cores), so the pre-flight builds them before any trial (:mod:`autotune.engines.cuda_ext`).
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
from autotune.engines.cuda_ext import EXLLAMAV3
from autotune.engines.doctor import Check
from autotune.engines.doctor import check_exllama
from autotune.engines.exllamav2.engine import generation_from_results
from autotune.engines.exllamav2.plan import gpus_of
from autotune.engines.exllamav2.plan import job_args
from autotune.engines.exllamav2.plan import validate_gpu_settings
from autotune.engines.exllamav2.pump import JobPump
from autotune.engines.exllamav2.pump import PumpFailed
from autotune.engines.exllamav3.plan import DRAFT_CACHE_MODES
from autotune.engines.exllamav3.plan import DRAFT_MODES
from autotune.engines.exllamav3.plan import PAGE
from autotune.engines.exllamav3.plan import TP_BACKENDS
from autotune.engines.exllamav3.plan import failure_reason
from autotune.engines.exllamav3.plan import load_plan
from autotune.engines.exllamav3.plan import plan_reasons
from autotune.engines.exllamav3.plan import split_mode
from autotune.engines.exllamav3.plan import tabby_config
from autotune.engines.exllamav3.plan import tabby_warnings
from autotune.engines.exllamav3.plan import tabby_yaml
from autotune.errors import InfeasibleConfig
from autotune.hardware import VramSampler
from autotune.hardware import pci_bus_order_env
from autotune.measure.types import Generation

KNOBS = {
    "model": Knob("str", doc="EXL3 variant (engine.variants: path; bpw from its config.json)"),
    "max_seq_len": Knob("int", low=256, high=1 << 20, spelling="max_seq_len"),
    "cache_size": Knob("int", low=256, high=1 << 22, spelling="cache_size"),
    "cache_mode": Knob("str", doc="FP16 or k,v bits 2-8 like 8,8 (Q4/Q6/Q8 = 4,4/6,6/8,8)",
                       spelling="cache_mode (CacheLayer_quant k_bits, v_bits)"),
    "tensor_parallel": Knob("bool", spelling="tensor_parallel (model.load tensor_p)"),
    "tensor_parallel_backend": Knob("str", TP_BACKENDS, spelling="tensor_parallel_backend (tp_backend)"),
    "gpu_split": Knob("str|list", doc="auto | GB per GPU ('30,22' or a list)",
                      spelling="gpu_split (use_per_device)"),
    "autosplit_reserve": Knob("int", low=0, high=1 << 16, doc="MB kept free on GPU 0 by autosplit",
                              spelling="autosplit_reserve (reserve_per_device, GB)"),
    "chunk_size": Knob("int", low=PAGE, high=1 << 16, spelling="chunk_size (max_chunk_size)"),
    "max_batch_size": Knob("int", low=1, high=1024, spelling="max_batch_size"),
    "draft_model": Knob("str", doc="draft variant name or none", spelling="draft_model_name"),
    "draft_mode": Knob("str", DRAFT_MODES, spelling="draft_mode"),
    "draft_num_tokens": Knob("int", low=1, high=16, spelling="draft_num_tokens (num_draft_tokens)"),
    "draft_cache_mode": Knob("str", DRAFT_CACHE_MODES, spelling="draft_cache_mode"),
    "ngram_match_min": Knob("int", low=1, high=16, spelling="ngram_match_min"),
}


@dataclass(frozen=True)
class ExLlamaV3Settings(EngineSettings):
    """``engine.settings`` of ExLlamaV3 (``gpus``: the resource plan); knobs may be fixed here."""

    default_variant: str | None = None  # the baseline's model (default: the first variant)
    defaults: dict = field(default_factory=dict)  # the baseline (trial 0) over TabbyAPI's defaults
    num_cpus: float = 1.0  # Ray CPUs per trial
    request_timeout_s: float = 600.0  # one request's wait for its results
    export_port: int | None = None  # the port written into tabbyapi.yml
    build_extension: bool = True  # build the CUDA kernels in the pre-flight
    extension_build_timeout_s: float = 1800.0


def exl3_defaults(s: ExLlamaV3Settings, variants: dict) -> dict[str, Any]:
    """TabbyAPI main's defaults for every knob (max_seq_len 4096: the model's own may be huge)."""
    out = {
        "model": s.default_variant or next(iter(variants), None),
        "max_seq_len": 4096, "cache_size": None, "cache_mode": "FP16", "tensor_parallel": False,
        "tensor_parallel_backend": "native", "gpu_split": "auto", "autosplit_reserve": 96,
        "chunk_size": 2048, "max_batch_size": None, "draft_model": "none", "draft_mode": "model",
        "draft_num_tokens": 4, "draft_cache_mode": "FP16", "ngram_match_min": 2,
    }
    return {**out, **s.defaults}


class ExLlamaV3Engine(Engine):
    """ExLlamaV3's Generator in-process in the trial worker (CUDA only), batched by one pump."""

    name = "exllamav3"
    package_fix = "pip install exllamav3"
    needs_gpu = True
    predictor = "autotune.engines.exllamav3.predict:predict_exllamav3"
    context_knob = "max_seq_len"
    cuda_kernels = EXLLAMAV3  # built in the pre-flight, outside any trial
    settings_schema = ExLlamaV3Settings
    supports_quality = False  # logprobs are not wired up for exllamav3 yet
    quality_hint = "the exllamav3 engine does not expose logits yet"
    knobs = KNOBS

    @classmethod
    def doctor_checks(cls, model: Path | None = None) -> list[Check]:
        return check_exllama()

    @classmethod
    def default_params(cls, settings: dict, variants: dict) -> dict[str, Any]:
        return exl3_defaults(cls.typed_settings(settings), variants)

    @classmethod
    def validate_more(cls, settings: dict, variants: dict, path: str = "engine") -> None:
        validate_gpu_settings(settings, variants, path)

    @classmethod
    def resources(cls, params: dict, settings: dict) -> Resources:
        p = cls.full_params(params, settings)
        try:
            split = split_mode(p, settings)[1]
        except ValueError:
            split = []
        n = len(split) if split else max(len(gpus_of(settings)), 1)
        return Resources(num_cpus=float(cls.typed_settings(settings).num_cpus), num_gpus=float(n))

    @classmethod
    def engine_reasons(cls, params: dict, settings: dict) -> list[str]:
        from autotune.engines.exllamav2.plan import parse_split
        from autotune.engines.exllamav2.plan import split_reasons

        p = cls.full_params(params, settings)
        reasons = plan_reasons(p, settings)
        if reasons:
            return reasons
        mode, split = parse_split(p.get("gpu_split"))
        if mode == "tp":
            reasons.append("gpu_split=tp is ExLlamaV2's spelling: set tensor_parallel: true")
        elif mode == "manual":
            reasons += split_reasons(split, gpus_of(settings))
        return reasons

    @classmethod
    def export_warnings(cls, params: dict, settings: dict) -> list[str]:
        return tabby_warnings(cls.full_params(params, settings), settings)

    @classmethod
    def export(cls, params: dict, settings: dict, variants: dict, out_dir: Path) -> list[Path]:
        from autotune.engines.tabbyapi.check import write_tabby_files

        p = cls.full_params(params, settings, variants)
        warnings = tabby_warnings(p, settings)
        return write_tabby_files(out_dir, tabby_yaml(tabby_config(p, settings, variants), warnings, "main"),
                                 warnings)

    @classmethod
    def check_export(cls, files: list[Path]) -> list[str]:
        """tabbyapi.yml against TabbyAPI main's config model (tabbyapi.schema_main)."""
        from autotune.engines.tabbyapi.check import check_tabby_files

        return check_tabby_files(files)

    @classmethod
    def describe_launch(cls, params: dict, settings: dict, variants: dict,
                        workload: dict | None = None) -> str:
        plan = load_plan(cls.full_params(params, settings, variants), settings)
        return f"exllamav3 in-process: load {plan['load']}, cache {plan['cache']}, generator {plan['generator']}"

    # ---- worker side (needs CUDA + exllamav3) ----------------------------------------------
    def _load(self, ex3, path: Path, load: dict, cache_kw: dict):
        """Config -> Model -> Cache (before load, as TabbyAPI) -> model.load(...)."""
        config = ex3.Config.from_directory(str(path))
        model = ex3.Model.from_config(config)
        kw = {k: cache_kw[k] for k in ("max_batch_size", "max_history")}
        if cache_kw["k_bits"] is not None:
            kw.update(layer_type=ex3.CacheLayer_quant, k_bits=cache_kw["k_bits"], v_bits=cache_kw["v_bits"])
        cache = ex3.Cache(model, max_num_tokens=cache_kw["max_num_tokens"], **kw)
        model.load(**load)
        return config, model, cache

    def start(self) -> None:
        os.environ.update(pci_bus_order_env())  # CUDA numbers GPUs as NVML does (VramSampler)
        import torch

        if not torch.cuda.is_available():
            raise InfeasibleConfig("exllamav3 needs a CUDA GPU; none is visible")
        from autotune.engines.variants import resolve_variant

        for reason in self.check(self.params, self.settings):
            raise InfeasibleConfig(reason)
        p = self.full_params(self.params, self.settings, self.variants)
        plan = load_plan(p, self.settings)
        self.info["load_plan"] = plan
        self.vram = VramSampler().__enter__()
        import exllamav3 as ex3

        draft_model = draft_cache = None
        try:
            if plan["draft"]:
                d = plan["draft"]
                _, draft_model, draft_cache = self._load(
                    ex3, resolve_variant(d["variant"], self.variants), d["load"], d["cache"])
            config, self.model, self.cache = self._load(
                ex3, resolve_variant(p["model"], self.variants), plan["load"], plan["cache"])
            self.tokenizer = ex3.Tokenizer.from_config(config)
            gen_kw = {k: v for k, v in plan["generator"].items() if v is not None}
            self.generator = ex3.Generator(model=self.model, cache=self.cache, tokenizer=self.tokenizer,
                                           draft_model=draft_model, draft_cache=draft_cache, **gen_kw)
        except Exception as e:  # noqa: BLE001 - classified: infeasible (OOM) or failed
            reason = failure_reason(e)
            if reason is None:
                raise
            raise InfeasibleConfig(reason) from e
        self.draft_model = draft_model
        self.pump = JobPump(self.generator)
        self.cached_tokens = 0

    def generate(self, prompt: str, max_tokens: int, ignore_eos: bool = True) -> Generation:
        from exllamav3 import Job
        from exllamav3.generator.sampler import ArgmaxSampler

        ids = self.tokenizer.encode(prompt, add_bos=True)
        # exllamav3's Job ends at new_tokens >= max_new_tokens - num_draft_tokens (job.py), as v2
        args = job_args(max_tokens, ignore_eos, getattr(self.generator, "num_draft_tokens", 0) or 0,
                        self.tokenizer.eos_token_id)

        def job(ident: int):
            return Job(input_ids=ids, sampler=ArgmaxSampler(), identifier=ident, **args)

        try:
            ident, t0, q = self.pump.submit(job)
            results = list(self.pump.results(ident, q, float(self.opts.request_timeout_s)))
        except PumpFailed as e:
            reason = failure_reason(e.cause)
            if reason is None:
                raise
            raise InfeasibleConfig(reason) from e.cause
        gen, cached = generation_from_results(results, t0, ids.shape[-1])
        self.cached_tokens += cached
        self.info["cached_tokens"] = self.cached_tokens
        return gen

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
        for attr in ("model", "draft_model"):
            model = getattr(self, attr, None)
            if model is not None:
                try:
                    model.unload()
                except Exception:  # noqa: BLE001 - best effort at teardown
                    pass
        for attr in ("generator", "cache", "model", "draft_model", "tokenizer"):
            setattr(self, attr, None)
        if getattr(self, "vram", None) is not None:
            self.vram.__exit__(None, None, None)
            self.vram = None
        try:
            import torch

            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass
