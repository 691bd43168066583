"""Offline GPU check: tiny models, EXL2 (and GGUF) conversions, real trials, one table.

Usage (on a machine with CUDA, nvcc, torch, transformers, safetensors; no network)::

    python -m autotune.tools.gpu_check [--out DIR] [--work DIR] [--bpw 4.0 6.0]
        [--gguf-converter PATH/convert_hf_to_gguf.py] [--max-tokens 64] [--timeout 600]

It makes a small random Llama and a smaller draft with the same vocabulary
(:mod:`autotune.tools.make_tiny_llama`), converts both to EXL2 at two bpw levels with
exllamav2's own converter and its shipped calibration text, optionally builds a GGUF with
llama.cpp's ``convert_hf_to_gguf.py``, then runs the trial worker directly (no Ray, no
MLflow; :func:`autotune.trial.runner.run_trial`) over the cases of :func:`exl2_cases` and
:func:`llamacpp_cases`. It prints one table (status, decode tok/s, TTFT, VRAM, accept rate,
reason) and writes it, with the raw results, under ``--out`` (default ``$OUT``, else
``bench/results/gpu``). Steps that cannot run (no CUDA, no exllamav2, no GGUF converter,
llama-cpp-python without CUDA) become rows with status ``skipped`` and the reason.
See docs/gpu.md for what to carry to a machine without network.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from autotune._files import write_atomic
from autotune.engines.exllamav2.ext import build_extension
from autotune.tools.make_tiny_llama import make_tiny_llama
from autotune.trial.runner import run_trial
from autotune.trial.spec import TrialResult
from autotune.trial.spec import TrialSpec

# target: 4 layers, hidden 256 (4 heads of 64); draft: 2 layers, hidden 128; same tokenizer
TARGET = {"num_layers": 4, "hidden_size": 256, "intermediate_size": 768, "num_heads": 4}
DRAFT = {"num_layers": 2, "hidden_size": 128, "intermediate_size": 384, "num_heads": 2}
COLUMNS = ("case", "engine", "status", "decode tok/s", "TTFT p50 ms", "VRAM GiB", "accept", "reason")


@dataclass(frozen=True)
class Case:
    """One trial of the check: an engine, its parameters and fixed settings."""

    name: str
    engine: str
    params: dict
    settings: dict = field(default_factory=dict)
    concurrency: int = 1


@dataclass(frozen=True)
class Row:
    """One line of the table."""

    case: str
    engine: str
    status: str
    decode_tps: float | None = None
    ttft_ms: float | None = None
    vram_gb: float | None = None
    accept_rate: float | None = None
    reason: str = ""


def exl2_cases(bpws: list[float], vram_gib: float) -> list[Case]:
    """exllamav2 cases: each bpw at baseline, then the knobs on the first bpw.

    Cache FP16/Q8/Q4, draft off/on with K 2 and 4, layer skipping on, autosplit and a manual
    split, paged auto/on/off, and a batch of 4 concurrent requests.
    """
    base = {"max_seq_len": 2048, "cache_mode": "FP16", "gpu_split": "auto", "chunk_size": 512}
    first = f"t{bpws[0]:g}"
    cases = [Case(f"exl2 {b:g}bpw base", "exllamav2", {**base, "model": f"t{b:g}"}) for b in bpws]
    knobs = [
        ("cache Q8", {"cache_mode": "Q8"}), ("cache Q4", {"cache_mode": "Q4"}),
        ("draft K2", {"draft_model": "d", "num_draft_tokens": 2}),
        ("draft K4", {"draft_model": "d", "num_draft_tokens": 4}),
        ("layer skip 0.5", {"layer_skip_threshold": 0.5}),
        ("manual split", {"gpu_split": f"{max(min(vram_gib - 1.0, 8.0), 1.0):g}"}),
        ("paged on", {"paged": True}), ("non-paged", {"paged": False}),
    ]
    cases += [Case(f"exl2 {bpws[0]:g}bpw {name}", "exllamav2", {**base, "model": first, **kw}) for name, kw in knobs]
    cases.append(Case(f"exl2 {bpws[0]:g}bpw batch x4", "exllamav2", {**base, "model": first}, concurrency=4))
    return cases


def llamacpp_cases() -> list[Case]:
    """llama-cpp-python with CUDA: full offload, flash attention off/on, a quantized KV pair."""
    base = {"model": "g", "n_gpu_layers": -1, "n_ctx": 1024, "flash_attn": False}
    return [
        Case("llama.cpp offload", "llamacpp", base),
        Case("llama.cpp offload + FA", "llamacpp", {**base, "flash_attn": True}),
        Case("llama.cpp FA q8_0/q8_0", "llamacpp", {**base, "flash_attn": True, "type_k": "q8_0", "type_v": "q8_0"}),
    ]


def make_spec(number: int, case: Case, variants: dict, workdir: Path, max_tokens: int, timeout_s: float) -> TrialSpec:
    """The TrialSpec the trial worker runs for ``case``."""
    workload = {"prompts": "short", "max_tokens": max_tokens, "warmup": 1, "repeats": 4,
                "ignore_eos": True, "concurrency": case.concurrency}
    return TrialSpec(number=number, engine=case.engine, settings=dict(case.settings), variants=variants,
                     params=dict(case.params), workload=workload, quality={"enabled": False},
                     timeout_s=timeout_s, workdir=str(workdir / f"trial-{number:02d}"))


def row_of(case: Case, result: TrialResult) -> Row:
    """A table row from a trial result."""
    m = result.metrics or {}
    ttft = next((v for k, v in m.items() if k.startswith("ttft_p50")), None)
    return Row(case.name, case.engine, result.status, m.get("decode_tps"), ttft, m.get("vram_peak_gb"),
               m.get("accept_rate"), (result.reason or "").splitlines()[0][:160] if result.reason else
               str((result.info or {}).get("generator_mode", "")))


def render_table(rows: list[Row]) -> str:
    """The rows as a Markdown table (numbers to 3 significant digits, '-' when absent)."""

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.3g}"

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = [r.case, r.engine, r.status, num(r.decode_tps), num(r.ttft_ms), num(r.vram_gb),
                 num(r.accept_rate), r.reason.replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def environment() -> dict:
    """What this machine has for the check (no CUDA initialisation outside torch)."""
    env: dict = {"python": sys.version.split()[0]}
    for mod in ("torch", "transformers", "exllamav2", "flash_attn", "llama_cpp", "gguf"):
        env[mod] = importlib.util.find_spec(mod) is not None
    env["cuda"] = False
    if env["torch"]:
        import torch

        env["cuda"] = torch.cuda.is_available()
        if env["cuda"]:
            env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            env["vram_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    return env


def make_models(work: Path) -> dict[str, Path]:
    """The target and the draft (same vocabulary) as HF folders, fp16."""
    return {"target": make_tiny_llama(work / "hf-target", seed=1, dtype="float16", **TARGET),
            "draft": make_tiny_llama(work / "hf-draft", seed=2, dtype="float16", **DRAFT)}


def _run(argv: list[str], timeout_s: float, log: Path) -> str:
    """Run a step; '' if it worked, else the reason (last lines of its output)."""
    with open(log, "w") as f:
        try:
            done = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout_s:g} s ({log})"
    if done.returncode:
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-2:])[:300]
    return ""


def convert_exl2(src: Path, dst: Path, bpw: float, work: Path, timeout_s: float) -> str:
    """exllamav2's converter with its shipped calibration data (no -c); '' or the reason."""
    tmp = work / f"exl2-work-{dst.name}"
    tmp.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "exllamav2.conversion.convert_exl2", "-i", str(src), "-o", str(tmp),
            "-cf", str(dst), "-b", str(bpw), "-hb", "8", "-r", "16", "-mr", "8", "-l", "512", "-ml", "512", "-nr"]
    return _run(argv, timeout_s, work / f"convert-{dst.name}.log")


def build_gguf(src: Path, dst: Path, converter: Path, work: Path, timeout_s: float) -> str:
    """llama.cpp's convert_hf_to_gguf.py (needs the gguf package) to an f16 GGUF."""
    argv = [sys.executable, str(converter), str(src), "--outfile", str(dst), "--outtype", "f16"]
    return _run(argv, timeout_s, work / "gguf.log")


def run_cases(cases: list[Case], variants: dict, work: Path, max_tokens: int, timeout_s: float,
              skip: dict[str, str]) -> tuple[list[Row], list[dict]]:
    """Run each case with the trial worker (``skip``: engine -> reason not to)."""
    rows, raw = [], []
    for i, case in enumerate(cases):
        if case.engine in skip:
            rows.append(Row(case.name, case.engine, "skipped", reason=skip[case.engine]))
            continue
        t0 = time.monotonic()
        result = run_trial(make_spec(i, case, variants, work, max_tokens, timeout_s))
        rows.append(row_of(case, result))
        raw.append({"case": asdict(case), "status": result.status, "reason": result.reason,
                    "metrics": result.metrics, "wall_s": time.monotonic() - t0})
        print(render_table(rows[-1:]).splitlines()[-1], flush=True)
    return rows, raw


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results/gpu")
    ap.add_argument("--work", help="scratch folder (default: a temporary one)")
    ap.add_argument("--bpw", type=float, nargs=2, default=[4.0, 6.0])
    ap.add_argument("--gguf-converter", help="llama.cpp's convert_hf_to_gguf.py (optional)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=600.0, help="per trial, seconds")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="autotune-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    env = environment()
    print("environment:", json.dumps(env), flush=True)
    skip: dict[str, str] = {}
    if not env["cuda"]:
        skip = {"exllamav2": "no CUDA GPU (torch.cuda.is_available() is False)", "llamacpp": "no CUDA GPU"}
    elif not env["transformers"]:
        skip = {e: "transformers is not installed (needed to make the models)" for e in ("exllamav2", "llamacpp")}
    variants: dict = {}
    if not skip:
        models = make_models(work)
        skip.update(_prepare_exl2(models, work, args.bpw, variants, env))
        skip.update(_prepare_gguf(models, work, args.gguf_converter, variants, env))
    cases = exl2_cases(args.bpw, float(env.get("vram_gib", 80.0))) + llamacpp_cases()
    rows, raw = run_cases(cases, variants, work, args.max_tokens, args.timeout, skip)
    table = render_table(rows)
    print(table, flush=True)
    write_atomic(out / "gpu_check.md", f"# autotune GPU check\n\nenvironment: `{json.dumps(env)}`\n\n{table}")
    write_atomic(out / "gpu_check.json", json.dumps({"environment": env, "rows": [asdict(r) for r in rows],
                                                     "results": raw}, indent=1, default=str))
    print(f"written: {out / 'gpu_check.md'}, {out / 'gpu_check.json'}")
    return 0 if all(r.status in ("ok", "skipped", "infeasible") for r in rows) else 1


def _prepare_exl2(models: dict[str, Path], work: Path, bpws: list[float], variants: dict, env: dict) -> dict:
    if not env["exllamav2"]:
        return {"exllamav2": "exllamav2 is not installed (see docs/gpu.md: carry its wheel)"}
    missing = build_extension()
    if missing:
        return {"exllamav2": missing[0]}
    for b in bpws:
        for key, src in (("t", models["target"]), ("d", models["draft"])):
            if key == "d" and b != bpws[0]:
                continue
            dst = work / f"exl2-{key}{b:g}"
            why = convert_exl2(src, dst, b, work, 1800)
            if why:
                return {"exllamav2": f"EXL2 conversion failed: {why}"}
            variants[f"{key}{b:g}" if key == "t" else "d"] = {"path": str(dst), "bpw": b}
    return {}


def _prepare_gguf(models: dict[str, Path], work: Path, converter: str | None, variants: dict, env: dict) -> dict:
    if not env["llama_cpp"]:
        return {"llamacpp": "llama-cpp-python is not installed (docs/gpu.md: build it with CUDA)"}
    import llama_cpp

    if not llama_cpp.llama_supports_gpu_offload():
        return {"llamacpp": "llama-cpp-python has no GPU backend (CMAKE_ARGS=-DGGML_CUDA=on)"}
    if not converter or not env["gguf"]:
        return {"llamacpp": "no GGUF: pass --gguf-converter and carry the gguf package"}
    dst = work / "target-f16.gguf"
    why = build_gguf(models["target"], dst, Path(converter), work, 600)
    if why:
        return {"llamacpp": f"GGUF conversion failed: {why}"}
    variants["g"] = {"path": str(dst)}
    return {}


if __name__ == "__main__":
    sys.exit(main())
