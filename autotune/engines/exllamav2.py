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

import math
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
from autotune.trial.spec import write_atomic

CACHE_MODES = ("FP16", "Q8", "Q6", "Q4")
CACHE_CLASSES = {"FP16": "ExLlamaV2Cache", "Q8": "ExLlamaV2Cache_Q8", "Q6": "ExLlamaV2Cache_Q6",
                 "Q4": "ExLlamaV2Cache_Q4"}
PAGE = 256  # PAGED_PAGE_SIZE: cache sizes and chunk sizes are multiples of it
MAX_Q_SIZE = 8  # generator default; num_draft_tokens <= max_q_size
TABBY_DRAFT_K = 4  # TabbyAPI's exllamav2 backend never passes num_draft_tokens


def round_up(n: int, step: int = PAGE) -> int:
    return int(math.ceil(n / step) * step)


def parse_split(value: Any) -> tuple[str, list[float]]:
    """``gpu_split`` → (mode, GB per GPU): ("auto", []), ("tp", []) or ("manual", [..])."""
    if value in (None, "auto"):
        return "auto", []
    if value == "tp":
        return "tp", []
    if isinstance(value, str):
        try:
            value = [float(x) for x in value.replace(" ", "").split(",") if x]
        except ValueError as e:
            raise ValueError(f"gpu_split {value!r}: expected auto, tp or GB per GPU like 30,26") from e
    if isinstance(value, (list, tuple)) and value and all(isinstance(x, (int, float)) for x in value):
        return "manual", [float(x) for x in value]
    raise ValueError(f"gpu_split {value!r}: expected auto, tp or GB per GPU like [30, 26]")


def gpus_of(settings: dict) -> list[dict]:
    """The resource plan's GPUs: settings.gpus = [{name, memory_gb}, ...]."""
    return list(settings.get("gpus") or [])


def split_reasons(split: list[float], gpus: list[dict]) -> list[str]:
    """Why a manual split cannot fit the planned GPUs ([] if it fits)."""
    if not gpus:
        return []
    if len(split) > len(gpus):
        return [f"gpu_split {split} names {len(split)} GPUs; the plan has {len(gpus)}"]
    return [f"gpu_split puts {gb:g} GB on GPU {i} ({gpus[i].get('name', '?')}), "
            f"which has {gpus[i]['memory_gb']:g} GB"
            for i, gb in enumerate(split) if gb > float(gpus[i]["memory_gb"])]


def load_plan(params: dict, settings: dict) -> dict[str, Any]:
    """How the worker loads the model: a plain dict (what the exllamav2 calls receive)."""
    mode, split = parse_split(params.get("gpu_split"))
    n_gpus = max(len(gpus_of(settings)), 1)
    max_seq_len = int(params["max_seq_len"])
    chunk = int(params["chunk_size"])
    cache_size = round_up(max(int(params.get("cache_size") or 0), max_seq_len))
    draft = params.get("draft_model") or "none"
    reserve = [int(params.get("autosplit_reserve_mb", 96)) * 1024**2] + [0] * (n_gpus - 1)
    return {
        "mode": mode, "gpu_split": split, "reserve_vram": reserve, "cache_class": CACHE_CLASSES[params["cache_mode"]],
        "cache_size": cache_size, "max_seq_len": max_seq_len, "max_input_len": chunk,
        "max_attention_size": chunk**2, "no_graphs": mode == "tp",
        "generator": {"max_batch_size": params.get("max_batch_size"), "max_chunk_size": chunk,
                      "max_seq_len": max_seq_len,
                      "num_draft_tokens": int(params["num_draft_tokens"]) if draft != "none" else 4},
        "draft": None if draft == "none" else {
            "variant": draft, "cache_class": CACHE_CLASSES[params.get("draft_cache_mode", "FP16")],
        },
        "layer_skip_threshold": params.get("layer_skip_threshold"),
    }


def skip_candidates(n_layers: int) -> range:
    """Layers that may be skipped: the middle half (the first and last quarter always run)."""
    return range(n_layers // 4, n_layers - n_layers // 4)


def select_skips(similarity: list[float], threshold: float | None) -> list[int]:
    """Middle-half layers whose cos(input, output) is above ``threshold``."""
    if threshold is None or threshold >= 1.0:
        return []
    return [i for i in skip_candidates(len(similarity)) if similarity[i] > threshold]


def filter_modules(modules: list, layer_starts: list[int], skip: list[int]) -> tuple[list, int, int]:
    """Drop the modules of the skipped layers (§1.4).

    ``layer_starts[i]`` is the index in ``modules`` of layer i's first module (its
    attention); layer i ends where layer i+1 starts, the last layer at the final norm,
    ``layer_starts[-1]``, which is therefore one longer than the number of layers.
    Returns (modules, head_layer_idx, last_kv_layer_idx) for the filtered model.
    """
    drop: set[int] = set()
    for i in skip:
        drop.update(range(layer_starts[i], layer_starts[i + 1]))
    kept = [m for j, m in enumerate(modules) if j not in drop]
    attn = {id(modules[s]) for i, s in enumerate(layer_starts[:-1]) if i not in skip}
    last_kv = max(j for j, m in enumerate(kept) if id(m) in attn)
    return kept, len(kept) - 1, last_kv


# ---- TabbyAPI export (exl2-checkpoint) -----------------------------------------------------
def _dir_name(path: str | None) -> tuple[str, str | None]:
    if not path:
        return "models", None
    p = Path(path)
    return str(p.parent), p.name


def tabby_warnings(params: dict, settings: dict | None = None) -> list[str]:
    """What the TabbyAPI export cannot reproduce of the tuned configuration."""
    out = []
    draft = params.get("draft_model") or "none"
    k = params.get("num_draft_tokens")
    if draft != "none" and k is not None and int(k) != TABBY_DRAFT_K:
        out.append(
            f"num_draft_tokens={k} was tuned, but TabbyAPI's exllamav2 backend ignores "
            f"draft_num_tokens and always drafts {TABBY_DRAFT_K} tokens: the served speed will "
            f"differ from the measured one (run exllamav2 directly to use K={k})."
        )
    if params.get("layer_skip_threshold") is not None and float(params["layer_skip_threshold"]) < 1.0:
        out.append(
            f"layer_skip_threshold={params['layer_skip_threshold']} was tuned, but layer skipping "
            "is not a TabbyAPI option: TabbyAPI runs every layer, so speed and quality will "
            "differ from the measured ones."
        )
    if len(gpus_of(settings or {})) == 1 and parse_split(params.get("gpu_split"))[0] != "auto":
        out.append("TabbyAPI ignores gpu_split and tensor_parallel with a single GPU.")
    return out


def tabby_config(params: dict, settings: dict, variants: dict) -> dict:
    """config.yml for TabbyAPI's exl2-checkpoint branch (keys of its config_sample.yml)."""
    plan = load_plan(params, settings)
    model_dir, model_name = _dir_name((variants.get(params.get("model")) or {}).get("path"))
    mode, split = plan["mode"], plan["gpu_split"]
    draft = plan["draft"]
    d_dir, d_name = _dir_name((variants.get(draft["variant"]) or {}).get("path") if draft else None)
    return {
        "network": {"host": "127.0.0.1", "port": int(settings.get("export_port", 5000))},
        "model": {
            "model_dir": model_dir, "model_name": model_name, "backend": "exllamav2",
            "max_seq_len": plan["max_seq_len"], "cache_size": plan["cache_size"],
            "cache_mode": params["cache_mode"], "tensor_parallel": mode == "tp",
            "gpu_split_auto": mode == "auto", "gpu_split": split,
            "autosplit_reserve": [int(params.get("autosplit_reserve_mb", 96))],
            "chunk_size": plan["max_input_len"], "max_batch_size": params.get("max_batch_size"),
        },
        "draft_model": {
            "draft_model_dir": d_dir, "draft_model_name": d_name,
            "draft_cache_mode": params.get("draft_cache_mode", "FP16"), "draft_gpu_split": [],
            "draft_num_tokens": plan["generator"]["num_draft_tokens"] if draft else None,
        },
    }


def tabby_yaml(params: dict, settings: dict, variants: dict) -> str:
    """The config as YAML, with the export's warnings as comments at the top."""
    import yaml

    head = ["# TabbyAPI config.yml (exl2-checkpoint branch) exported by autotune.",
            "# Copy to tabbyAPI/config.yml; unlisted keys keep TabbyAPI's defaults."]
    for w in tabby_warnings(params, settings):
        head.append("# WARNING: " + w)
    body = yaml.safe_dump(tabby_config(params, settings, variants), sort_keys=False, default_flow_style=None)
    return "\n".join(head) + "\n" + body


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
        "gpu_split": Knob("str", doc="auto | tp | GB per GPU ('30,26' or a list)", spelling="gpu_split"),
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
