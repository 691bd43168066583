"""ExLlamaV2 0.3.2 in the trial worker (GPU only), and its TabbyAPI export: ``kind: exllamav2``.

Knob spellings and the load recipe follow ENGINE_KNOBS.md §1 (exllamav2) and §2 (TabbyAPI,
exl2-checkpoint branch, the last that drives exllamav2). ``gpu_split`` is ``"auto"``
(autosplit with ``autosplit_reserve_mb`` on GPU 0), ``"tp"`` (tensor parallel, balanced by
free VRAM) or GB per GPU (a list, or ``"30,26"`` as an Optuna-friendly string).
Timing comes from the dynamic generator's job results: TTFT = time_enqueued + time_prefill;
the spacing of the streamed results gives the decode rate. ``layer_skip_threshold`` is seed
001's method: layers of the middle half whose output hidden state has a cosine similarity
above the threshold with their input are removed from ``model.modules`` (§1.4).

The pure parts (:func:`load_plan`, :func:`split_reasons`, :func:`tabby_config`,
:func:`tabby_warnings`, :func:`skip_candidates`, :func:`filter_modules`) import nothing
from exllamav2 or torch, so they run and are tested on CPU.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any

from autotune.engines.base import Engine
from autotune.engines.base import Generation
from autotune.engines.base import InfeasibleConfig
from autotune.engines.base import Knob
from autotune.engines.base import Resources
from autotune.engines.exl2_plan import CACHE_CLASSES  # noqa: F401
from autotune.engines.exl2_plan import CACHE_MODES  # noqa: F401
from autotune.engines.exl2_plan import MAX_Q_SIZE  # noqa: F401
from autotune.engines.exl2_plan import PAGE  # noqa: F401
from autotune.engines.exl2_plan import TABBY_DRAFT_K  # noqa: F401
from autotune.engines.exl2_plan import _dir_name  # noqa: F401
from autotune.engines.exl2_plan import filter_modules  # noqa: F401
from autotune.engines.exl2_plan import gpus_of  # noqa: F401
from autotune.engines.exl2_plan import load_plan  # noqa: F401
from autotune.engines.exl2_plan import parse_split  # noqa: F401
from autotune.engines.exl2_plan import round_up  # noqa: F401
from autotune.engines.exl2_plan import select_skips  # noqa: F401
from autotune.engines.exl2_plan import skip_candidates  # noqa: F401
from autotune.engines.exl2_plan import split_reasons  # noqa: F401
from autotune.engines.exl2_plan import tabby_config  # noqa: F401
from autotune.engines.exl2_plan import tabby_warnings  # noqa: F401
from autotune.engines.exl2_plan import tabby_yaml  # noqa: F401
from autotune.trial.spec import write_atomic


class ExLlamaV2Engine(Engine):
    """ExLlamaV2 with the dynamic generator, in-process in the trial worker (CUDA only).

    ``generate`` is thread-safe: jobs are enqueued under a lock and one pump thread runs
    ``generator.iterate()``, so concurrent requests are batched by the generator.
    """

    name = "exllamav2"
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
    }

    @classmethod
    def default_params(cls, settings: dict, variants: dict) -> dict[str, Any]:
        out = {
            "model": settings.get("default_variant") or next(iter(variants), None),
            "max_seq_len": 4096, "cache_size": None, "cache_mode": "FP16", "gpu_split": "auto",
            "autosplit_reserve_mb": 96, "chunk_size": 2048, "max_batch_size": None,
            "draft_model": "none", "draft_cache_mode": "FP16", "num_draft_tokens": 4,
            "layer_skip_threshold": 1.0,
        }
        return {**out, **(settings.get("defaults") or {})}

    @classmethod
    def full_params(cls, params: dict, settings: dict, variants: dict | None = None) -> dict[str, Any]:
        fixed = {k: v for k, v in settings.items() if k in cls.knobs}
        out = {**cls.default_params(settings, variants or {}), **fixed}
        out.update({k: v for k, v in params.items() if v is not None})
        return out

    @classmethod
    def validate_settings(cls, settings: dict, variants: dict, path: str = "engine") -> None:
        from autotune.errors import ConfigError
        from autotune.models import validate_variants

        validate_variants(variants, f"{path}.variants")
        for i, g in enumerate(gpus_of(settings)):
            if not isinstance(g, dict) or not isinstance(g.get("memory_gb"), (int, float)):
                raise ConfigError(f"{path}.settings.gpus[{i}]", g, "expected {name: ..., memory_gb: NUMBER}")

    @classmethod
    def resources(cls, params: dict, settings: dict) -> Resources:
        p = cls.full_params(params, settings)
        mode, split = parse_split(p["gpu_split"])
        n = len(split) if mode == "manual" else max(len(gpus_of(settings)), 1)
        return Resources(num_cpus=float(settings.get("num_cpus", 1)), num_gpus=float(n))

    @classmethod
    def check(cls, params: dict, settings: dict) -> list[str]:
        p = cls.full_params(params, settings)
        reasons = [f"{k}={v!r} is not {cls.knobs[k].allowed()}" for k, v in p.items()
                   if k in cls.knobs and k != "gpu_split" and v is not None and not cls.knobs[k].accepts(v)]
        reasons += [f"{k} is not an exllamav2 knob" for k in params if k not in cls.knobs]
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
        if p.get("max_batch_size") and p["max_batch_size"] * MAX_Q_SIZE > p["chunk_size"]:
            reasons.append(f"max_batch_size*{MAX_Q_SIZE} must be <= chunk_size (exllamav2 generator limit)")
        skip = p.get("layer_skip_threshold")
        if skip is not None and skip < 1.0 and mode == "tp":
            reasons.append("layer skipping is not supported with tensor parallel loading")
        return reasons

    @classmethod
    def export_warnings(cls, params: dict, settings: dict) -> list[str]:
        return tabby_warnings(cls.full_params(params, settings), settings)

    @classmethod
    def export(cls, params: dict, settings: dict, variants: dict, out_dir: Path) -> list[Path]:
        p = cls.full_params(params, settings, variants)
        path = out_dir / "tabbyapi.yml"
        write_atomic(path, tabby_yaml(p, settings, variants))
        files = [path]
        warnings = tabby_warnings(p, settings)
        if warnings:
            files.append(out_dir / "tabbyapi_warnings.txt")
            write_atomic(files[-1], "\n".join(warnings) + "\n")
        return files

    # ---- worker side (needs CUDA + exllamav2) ----------------------------------------------
    def _load(self, path: Path, plan: dict, cache_class_name: str, draft: bool = False):
        import exllamav2 as ex

        config = ex.ExLlamaV2Config(str(path))
        config.arch_compat_overrides()
        config.max_seq_len = plan["max_seq_len"]
        config.max_input_len = plan["max_input_len"]
        config.max_attention_size = plan["max_attention_size"]
        config.no_graphs = config.no_graphs or plan["no_graphs"]
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

    def start(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise InfeasibleConfig("exllamav2 needs a CUDA GPU; none is visible")
        from autotune.gpus import VramSampler
        from autotune.models import resolve_variant

        for reason in self.check(self.params, self.settings):
            raise InfeasibleConfig(reason)
        p = self.full_params(self.params, self.settings, self.variants)
        plan = load_plan(p, self.settings)
        self.info["load_plan"] = plan
        self.vram = VramSampler().__enter__()
        import exllamav2 as ex
        from exllamav2.generator import ExLlamaV2DynamicGenerator

        draft_model = draft_cache = None
        try:
            if plan["draft"]:
                _, draft_model, draft_cache = self._load(
                    resolve_variant(plan["draft"]["variant"], self.variants), plan,
                    plan["draft"]["cache_class"], draft=True)
            config, self.model, self.cache = self._load(resolve_variant(p["model"], self.variants),
                                                        plan, plan["cache_class"])
        except (torch.cuda.OutOfMemoryError, ValueError, AssertionError) as e:
            raise InfeasibleConfig(f"exllamav2 could not load the model: {type(e).__name__}: {e}") from e
        self.tokenizer = ex.ExLlamaV2Tokenizer(config)
        if plan["layer_skip_threshold"] is not None and plan["layer_skip_threshold"] < 1.0:
            self._skip_layers(float(plan["layer_skip_threshold"]))
        gen_kw = {k: v for k, v in plan["generator"].items() if v is not None}
        self.generator = ExLlamaV2DynamicGenerator(
            model=self.model, cache=self.cache, tokenizer=self.tokenizer, draft_model=draft_model,
            draft_cache=draft_cache, **gen_kw)
        self.generator.warmup()
        self._lock = threading.Lock()
        self._queues: dict[int, queue.Queue] = {}
        self._next_id = 0
        self._stop = threading.Event()
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _layer_starts(self) -> list[int]:
        from exllamav2.attn import ExLlamaV2Attention

        starts = [j for j, m in enumerate(self.model.modules) if isinstance(m, ExLlamaV2Attention)]
        return starts + [self.model.head_layer_idx - 1]  # the final norm closes the last layer

    def _skip_layers(self, threshold: float) -> None:
        """Seed 001's calibration: cos(layer input, layer output) on a calibration prompt."""
        import torch

        from autotune.measure.quality import load_text

        starts = self._layer_starts()
        text = load_text(self.settings.get("calibration_text", "gpl3"))
        ids = self.tokenizer.encode(text)[:, : int(self.settings.get("calibration_tokens", 128))]
        r = self.model.forward_chunk(ids, cache=None, extract_state_indices=starts, last_id_only=True)
        states = [r["states"][j].float() for j in starts]
        sims = [float(torch.nn.functional.cosine_similarity(a.to(b.device), b, dim=-1).mean())
                for a, b in zip(states, states[1:], strict=False)]
        skip = select_skips(sims, threshold)
        self.model.modules, self.model.head_layer_idx, self.model.last_kv_layer_idx = filter_modules(
            self.model.modules, starts, skip)
        self.info.update(layer_similarity=[round(s, 5) for s in sims], skipped_layers=skip,
                         n_layers=len(sims))

    def _pump(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                results = self.generator.iterate() if self.generator.num_remaining_jobs() else None
            if not results:
                time.sleep(0.0005)
                continue
            now = time.perf_counter()
            for r in results:
                self._queues[r["identifier"]].put((now, r))

    def generate(self, prompt: str, max_tokens: int, ignore_eos: bool = True) -> Generation:
        from exllamav2.generator import ExLlamaV2DynamicJob
        from exllamav2.generator import ExLlamaV2Sampler

        ids = self.tokenizer.encode(prompt, add_bos=True)
        with self._lock:
            ident = self._next_id
            self._next_id += 1
            q: queue.Queue = queue.Queue()
            self._queues[ident] = q
            job = ExLlamaV2DynamicJob(
                input_ids=ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens if ignore_eos else 0,
                gen_settings=ExLlamaV2Sampler.Settings.greedy(), identifier=ident,
                stop_conditions=[] if ignore_eos else [self.tokenizer.eos_token_id])
            t0 = time.perf_counter()
            self.generator.enqueue(job)
        arrivals: list[float] = []
        text: list[str] = []
        while True:
            now, r = q.get(timeout=float(self.settings.get("request_timeout_s", 600)))
            if r["stage"] == "streaming" and (r.get("text") or r.get("token_ids") is not None):
                arrivals.append(now - t0)
                text.append(r.get("text", ""))
            if r.get("eos"):
                break
        e2e = time.perf_counter() - t0
        self._queues.pop(ident, None)
        ttft = float(r["time_enqueued"]) + float(r["time_prefill"])
        times = [ttft + (a - arrivals[0]) for a in arrivals] if arrivals else []
        accepted, rejected = int(r.get("accepted_draft_tokens", 0)), int(r.get("rejected_draft_tokens", 0))
        return Generation(int(r.get("prompt_tokens", ids.shape[-1])), int(r["new_tokens"]), times, e2e,
                          "".join(text), drafted=accepted + rejected, accepted=accepted)

    def logprobs(self, text: str, n_tokens: int):
        import torch

        ids = self.tokenizer.encode(text, add_bos=True)[:, :n_tokens]
        with torch.inference_mode():
            logits = self.model.forward(ids, cache=None, last_id_only=False)
        return ids[0].tolist(), logits[0].float().cpu().numpy()

    def memory(self) -> dict[str, float]:
        vram = getattr(self, "vram", None)
        if vram is None:
            return {}
        self.info["vram_per_gpu_gb"] = dict(vram.per_gpu)
        return {"vram_peak_gb": vram.peak_gb}

    def stop(self) -> None:
        if getattr(self, "_stop", None) is not None:
            self._stop.set()
            self._pump_thread.join(timeout=10)
        for attr in ("generator", "cache", "model", "tokenizer"):
            setattr(self, attr, None)
        if getattr(self, "vram", None) is not None:
            self.vram.__exit__(None, None, None)
        try:
            import torch

            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass
