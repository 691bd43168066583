"""Offline GPU check: tiny models, EXL2 / EXL3 / GGUF conversions, real trials, one table.

Usage (on a machine with CUDA, nvcc, torch, transformers, safetensors; no network)::

    python -m bench.gpu.kit.check --stage STAGE [STAGE ...] [--out DIR] [--work DIR]
        [--bpw 4.0 6.0] [--max-tokens 64]
        [--timeout 240] [--budget-s 540] [--total-s SECONDS] [--engines exllamav2 exllamav3 llama_server]

The stages (:mod:`bench.gpu.kit.stages`; ``all``, the default, runs them in one go):
``env``, ``ext`` (CUDA extension builds), ``models`` (a small random Llama and a smaller
draft with the same vocabulary, :mod:`autotune.tools.make_tiny_llama`, converted with each
library's own converter: :mod:`bench.gpu.kit.prepare`), the row groups ``exl2-a``,
``exl2-b``, ``llamacpp``, ``exl3`` (the trial worker run directly, no Ray, no MLflow:
:func:`autotune.trial.runner.run_trial`, over :func:`exl2_cases`, :func:`llamacpp_cases`,
:func:`exl3_cases`), and ``table``. Each is one command of under 10 minutes on a lent GPU
machine; each row is appended to ``rows.jsonl`` under ``--out`` (default ``$OUT``, else
``bench/gpu/out``, git-ignored: the committed table in ``bench/results/gpu`` is replaced only
by hand) and the state folder the moment it finishes, and ``gpu_check.md`` /
``gpu_check.json`` are rewritten after every stage. Rows that cannot run (no CUDA, a library
or a model missing) say ``skipped`` and why. See docs/gpu.md for the command sequence.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path

from autotune._files import write_atomic
from autotune.trial.runner import run_trial
from autotune.trial.spec import TrialResult
from autotune.trial.spec import TrialSpec
from bench.gpu.kit.llama import binary as llama_binary
from bench.gpu.kit.llama import build as llama_build
from bench.gpu.kit.llama import register_gguf
from bench.gpu.kit.prepare import DRAFT  # noqa: F401 - re-exported
from bench.gpu.kit.prepare import TARGET  # noqa: F401 - re-exported
from bench.gpu.kit.prepare import make_models  # noqa: F401 - re-exported
from bench.gpu.kit.prepare import stage_ext
from bench.gpu.kit.prepare import stage_models
from bench.gpu.kit.stages import BUDGET_S
from bench.gpu.kit.stages import ROOT
from bench.gpu.kit.stages import ROW_STAGES
from bench.gpu.kit.stages import STAGES
from bench.gpu.kit.stages import Deadline
from bench.gpu.kit.stages import RowLog
from bench.gpu.kit.stages import default_state
from bench.gpu.kit.stages import load_json
from bench.gpu.kit.stages import run_rows
from bench.gpu.kit.stages import select_stages

# engine -> its import name in the environment (env.json)
ENGINES = {"exllamav2": "exllamav2", "llama_server": "llama_server", "exllamav3": "exllamav3"}
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

    Cache FP16/Q8/Q4, draft off/on with K 2 and 4, the model as its own draft (greedy: the
    acceptance must be about 1, which checks how it is counted; the small random draft's is
    about 0), layer skipping on, autosplit and a manual split, paged auto/on/off, and a batch
    of 4 concurrent requests.
    """
    base = {"max_seq_len": 2048, "cache_mode": "FP16", "gpu_split": "auto", "chunk_size": 512}
    first = f"t{bpws[0]:g}"
    cases = [Case(f"exl2 {b:g}bpw base", "exllamav2", {**base, "model": f"t{b:g}"}) for b in bpws]
    knobs = [
        ("cache Q8", {"cache_mode": "Q8"}), ("cache Q4", {"cache_mode": "Q4"}),
        ("draft K2", {"draft_model": "d", "num_draft_tokens": 2}),
        ("draft K4", {"draft_model": "d", "num_draft_tokens": 4}),
        ("draft self K4", {"draft_model": first, "num_draft_tokens": 4}),
        ("layer skip 0.5", {"layer_skip_threshold": 0.5}),
        ("manual split", {"gpu_split": f"{max(min(vram_gib - 1.0, 8.0), 1.0):g}"}),
        ("paged on", {"paged": True}), ("non-paged", {"paged": False}),
    ]
    cases += [Case(f"exl2 {bpws[0]:g}bpw {name}", "exllamav2", {**base, "model": first, **kw}) for name, kw in knobs]
    cases.append(Case(f"exl2 {bpws[0]:g}bpw batch x4", "exllamav2", {**base, "model": first}, concurrency=4))
    return cases


def llamacpp_cases(binary: str = "llama-server") -> list[Case]:
    """The CUDA ``llama-server`` (engine ``llama_server``, built there: :mod:`bench.gpu.kit.llama`) on the
    tiny GGUF: every layer on the GPU vs 2 of 4, flash attention off/on, a q8_0 KV cache,
    ``--parallel`` 1 vs 4 under 4 concurrent requests. Log verbosity 4 makes the server print
    its model, KV and compute buffer sizes (``info.server_buffers_mib``, beside NVML's peak)."""
    base = {"model": "gg", "n_gpu_layers": "all", "ctx_size": 4096, "flash_attn": "off"}
    settings = {"binary": binary, "extra_args": ["-lv", "4"]}  # -lv 4: the log says its buffers
    return [
        Case("llama.cpp all layers on GPU", "llama_server", base, settings),
        Case("llama.cpp 2 of 4 layers on GPU", "llama_server", {**base, "n_gpu_layers": "2"}, settings),
        Case("llama.cpp FA on", "llama_server", {**base, "flash_attn": "on"}, settings),
        Case("llama.cpp FA q8_0/q8_0", "llama_server", {**base, "flash_attn": "on", "cache_type_k": "q8_0",
                                                        "cache_type_v": "q8_0"}, settings),
        Case("llama.cpp parallel 1 x4", "llama_server", {**base, "parallel": 1}, settings, concurrency=4),
        Case("llama.cpp parallel 4 x4", "llama_server", {**base, "parallel": 4}, settings, concurrency=4),
        *moe_cases(binary),
    ]


def moe_cases(binary: str = "llama-server", n_layers: int = 4) -> list[Case]:
    """Issue 44's GPU rows: the carried tiny MoE (variant ``moe``: :mod:`autotune.tools.make_tiny_moe`,
    4 layers of 8 experts) with every layer on the GPU and the experts of none, half and all of
    its layers kept in RAM (``--n-cpu-moe`` 0, 2, 4). The server's CUDA0 model buffer must fall
    as the tensor table predicts (:func:`predicted_gpu_mib`, written beside it in each row)."""
    base = {"model": "moe", "n_gpu_layers": "all", "ctx_size": 2048, "flash_attn": "off"}
    settings = {"binary": binary, "extra_args": ["-lv", "4"]}
    return [Case(f"llama.cpp MoE n_cpu_moe {n}", "llama_server", {**base, "n_cpu_moe": n}, settings)
            for n in (0, n_layers // 2, n_layers)]


def predicted_gpu_mib(case: Case, variants: dict) -> float | None:
    """The model bytes the tensor table puts on GPU 0 for a llama_server case (MiB), or None
    when the case's model file is not here or it is not a llama_server case."""
    path = (variants.get(str(case.params.get("model"))) or {}).get("path")
    if case.engine != "llama_server" or not path or not Path(path).is_file():
        return None
    from autotune.engines.llama_server.predict import gpu_layers
    from autotune.engines.llamacpp.moe import layer_table
    from autotune.engines.llamacpp.moe import place

    one_gpu = {"gpus": [{"index": 0}]}  # "all" is every layer where a GPU is declared
    p = {**case.params, "n_gpu_layers": gpu_layers(case.params.get("n_gpu_layers", "all"), one_gpu)}
    return place(layer_table(path), p, 1)["held"][1] / 2**20


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
    info = result.info or {}
    buffers = ", ".join(f"{k} {v:g}" for k, v in (info.get("server_buffers_mib") or {}).items())
    note = str(info.get("generator_mode", "")) or (f"server buffers MiB: {buffers}" if buffers else "")
    return Row(case.name, case.engine, result.status, m.get("decode_tps"), ttft, m.get("vram_peak_gb"),
               m.get("accept_rate"), (result.reason or "").splitlines()[0][:160] if result.reason else note)


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
    for mod in ("torch", "transformers", "exllamav2", "exllamav3", "flash_attn", "gguf"):
        env[mod] = importlib.util.find_spec(mod) is not None
    env["llama_server"] = llama_binary(default_state()).is_file()  # the CUDA build (kit.llama)
    env["cuda"] = False
    if env["torch"]:
        import torch

        env["cuda"] = torch.cuda.is_available()
        if env["cuda"]:
            env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            env["vram_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    return env


def exl3_cases() -> list[Case]:
    """exllamav3 (the engine at autotune/engines/exllamav3): FP16 / 4,4-bit cache, draft K4 (the
    small draft, the model itself), batch x4."""
    base = {"model": "e4", "max_seq_len": 2048, "cache_mode": "FP16", "chunk_size": 512}
    return [
        Case("exl3 4bpw base", "exllamav3", base),
        Case("exl3 4bpw cache 4,4", "exllamav3", {**base, "cache_mode": "4,4"}),
        Case("exl3 4bpw draft K4", "exllamav3", {**base, "draft_model": "ed", "draft_num_tokens": 4}),
        Case("exl3 4bpw draft self K4", "exllamav3", {**base, "draft_model": "e4", "draft_num_tokens": 4}),
        Case("exl3 4bpw batch x4", "exllamav3", base, concurrency=4),
    ]


def stage_cases(stage: str, bpws: list[float], vram_gib: float) -> list[Case]:
    """The trial rows of a row stage (exl2 split in two groups that each fit a 10-minute command)."""
    exl2 = exl2_cases(bpws, vram_gib)
    half = (len(exl2) + 1) // 2
    return {"exl2-a": exl2[:half], "exl2-b": exl2[half:], "exl3": exl3_cases(),
            "llamacpp": llamacpp_cases(str(llama_binary(default_state())))}[stage]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", nargs="*", default=["all"], help=f"all or some of: {' '.join(STAGES)}")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "gpu" / "out"),
                    help="where rows and the table go (default $OUT, else bench/gpu/out)")
    ap.add_argument("--work", help="state folder kept between stages (default bench/gpu/.work)")
    ap.add_argument("--bpw", type=float, nargs=2, default=[4.0, 6.0])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=240.0, help="per trial, seconds")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="per stage: start nothing after it")
    ap.add_argument("--total-s", type=float, help="for all the stages of this command together")
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES),
                    help="build, convert and run only these (the others' rows say skipped)")
    args = ap.parse_args(argv)
    try:
        stages = select_stages(args.stage)
    except ValueError as e:
        ap.error(str(e))
    out, work = Path(args.out), Path(args.work or default_state())
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    # extensions build once per machine, inside the checkout: a later command reuses them
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(work / "torch_extensions"))
    log = RowLog(work / "rows.jsonl", out / "rows.jsonl")
    failed = False
    total = Deadline(args.total_s if args.total_s is not None else float("inf"))
    for stage in stages:
        deadline = Deadline(min(args.budget_s, total.left()))
        print(f"== stage {stage} (budget {args.budget_s:g} s)", flush=True)
        if stage == "env" or not (work / "env.json").exists():
            write_atomic(work / "env.json", json.dumps(environment()))
        env = load_json(work / "env.json", {})
        print("environment:", json.dumps(env), flush=True)
        write_atomic(out / "environment.json", json.dumps(env))
        skip = engine_skips(env, args.engines)
        chosen = {**env, **{ENGINES[e]: False for e in ENGINES if e not in args.engines}}
        variants = load_json(work / "variants.json", {})
        if stage == "ext":
            stage_ext(chosen, work, deadline)
        elif stage == "models" and not all(e in skip for e in ENGINES):
            stage_models(work, args.bpw, chosen, deadline)
        elif stage in ROW_STAGES:
            if stage == "llamacpp" and env.get("cuda") and "llama_server" in args.engines:
                register_gguf(work)  # the tiny GGUF carried from here, variant gg
                why = llama_build(work, deadline)  # once per machine; timed in llama.json
                env = {**env, "llama_server": not why}
                write_atomic(work / "env.json", json.dumps(env))
                skip = {**engine_skips(env, args.engines), **({"llama_server": why} if why else {})}
                variants = load_json(work / "variants.json", {})
            cases = stage_cases(stage, args.bpw, float(env.get("vram_gib", 80.0)))

            def run_one(case: Case, timeout_s: float, variants=variants, skip=skip) -> tuple[Row, dict]:
                # each trial its own folder (trial.log, result.json), numbered by the rows so far
                return run_case(case, variants, work, args.max_tokens, timeout_s, skip, len(log.read()))

            run_rows(cases, run_one, log, deadline, args.timeout)
        failed |= _write_table(log, env, out)
    return 1 if failed else 0


def engine_skips(env: dict, chosen: list[str] | None = None) -> dict[str, str]:
    """Engines whose rows cannot (or are not to) run here, with the reason."""
    engines = tuple(ENGINES)
    if not env.get("cuda"):
        return {e: "no CUDA GPU (torch.cuda.is_available() is False)" for e in engines}
    if not env.get("transformers"):
        return {e: "transformers is not installed (needed to make the models)" for e in engines}
    skip = {}
    if not env.get("exllamav2"):
        skip["exllamav2"] = "exllamav2 is not installed (docs/gpu.md: carry its wheel)"
    if not env.get("exllamav3"):
        skip["exllamav3"] = "exllamav3 is not installed (docs/gpu.md: carry its wheel)"
    if not importlib.util.find_spec("autotune.engines.exllamav3"):
        skip["exllamav3"] = "this checkout has no exllamav3 engine (autotune/engines/exllamav3)"
    if not env.get("llama_server"):
        skip["llama_server"] = "no CUDA llama-server built here yet (the lease's llamacpp step builds it)"
    for e in engines:
        if chosen is not None and e not in chosen:
            skip.setdefault(e, "left out of this command (--engines)")
    return skip


def run_case(case: Case, variants: dict, work: Path, max_tokens: int, timeout_s: float,
             skip: dict[str, str], number: int) -> tuple[Row, dict]:
    """One row: skipped with its reason, or a trial run by the trial worker."""
    why = skip.get(case.engine) or _missing_variant(case, variants)
    if why:
        return Row(case.name, case.engine, "skipped", reason=why), {}
    t0 = time.monotonic()
    result = run_trial(make_spec(number, case, variants, work, max_tokens, timeout_s))
    raw = {"case": asdict(case), "status": result.status, "reason": result.reason, "metrics": result.metrics,
           "info": result.info, "wall_s": time.monotonic() - t0}
    row = row_of(case, result)
    predicted = predicted_gpu_mib(case, variants) if "n_cpu_moe" in case.params else None
    if predicted is not None:
        raw["predicted_gpu_model_mib"] = round(predicted, 3)
        row = replace(row, reason=f"{row.reason}; predicted GPU model {predicted:.2f}".lstrip("; "))
    return row, raw


def _missing_variant(case: Case, variants: dict) -> str:
    names = [case.params.get("model"), case.params.get("draft_model")]
    missing = [n for n in names if n and n != "none" and n not in variants]
    if not missing:
        return ""
    why = variants.get("_why", {}).get(case.engine)
    return why or f"model(s) {', '.join(missing)} not made yet: run stage models"


def _write_table(log: RowLog, env: dict, out: Path) -> bool:
    """gpu_check.md / .json from the last row of every case so far; True if a trial failed."""
    latest = log.latest()
    rows = [Row(**r["row"]) for r in latest.values()]
    raw = [r.get("raw") for r in latest.values() if r.get("raw")]
    table = render_table(rows)
    write_atomic(out / "gpu_check.md", f"# autotune GPU check\n\nenvironment: `{json.dumps(env)}`\n\n{table}")
    write_atomic(out / "gpu_check.json", json.dumps({"environment": env, "rows": [asdict(r) for r in rows],
                                                     "results": raw}, indent=1, default=str))
    print(table, flush=True)
    return any(r.status not in ("ok", "skipped", "infeasible") for r in rows)


if __name__ == "__main__":
    sys.exit(main())
