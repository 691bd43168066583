"""The lease in one command: what has no ``ok`` row yet, in order, each step archived as it ends.

``python -m bench.gpu.kit.lease [--total-s 540] [--out DIR] [--rows FILE]`` (run by
``bench/gpu/lease.sh`` after the ``env`` check). It reads the committed rows
(``bench/results/gpu/rows.jsonl``): a case is verified when its last row there is ``ok`` or
``infeasible`` with a reason (a planned refusal). The steps of :data:`STEPS` that still hold an
unverified case run in that order: ExLlamaV3 (kernels, its conversions, its rows), TabbyAPI
main with the exported config, llama.cpp on CUDA (build and rows), ExLlamaV2's leftovers (its
self-draft row), then TabbyAPI exl2-checkpoint with the EXL2 export. Each step gets what is left of ``--total-s`` less a reserve for the
table, and after each one the table (``gpu_check.md``) and ``logs.tgz`` (every log and JSON of
the state folder under 4 MB, no model files) are rewritten in ``$OUT``: a call cut off by its
limit still returns everything finished. A second command on the same warm machine resumes:
the state folder keeps kernel builds, conversions, the llama.cpp build and the rows, and a
stage skips what it already did.

Without a GPU (``nvidia-smi`` absent) it is the kit's dry run: the plan is printed, the CPU
parts run (the table, the TabbyAPI export), each GPU step says it was skipped, exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from bench.gpu.kit.stages import ROOT
from bench.gpu.kit.stages import RowLog
from bench.gpu.kit.stages import default_state

COMMITTED = ROOT / "bench" / "results" / "gpu" / "rows.jsonl"
RESERVE_S = 40.0  # the last table and archive
# step -> (engine of kit.check, its stages, the longest it may take)
STEPS = {
    "exl3": ("exllamav3", ["ext", "models", "exl3"], 480.0),
    "tabby": ("exllamav3", ["tabby"], 150.0),
    "llamacpp": ("llama_server", ["llamacpp"], 480.0),
    "exl2": ("exllamav2", ["ext", "models", "exl2-a", "exl2-b"], 420.0),
    "tabby-exl2": ("exllamav2", ["tabby"], 150.0),
}
TABBY_STEPS = {"tabby": "main", "tabby-exl2": "exl2"}  # step -> kit.tabby branch


def step_cases() -> dict[str, list[str]]:
    """The case names each step verifies."""
    from bench.gpu.kit.check import exl2_cases
    from bench.gpu.kit.check import exl3_cases
    from bench.gpu.kit.check import llamacpp_cases
    from bench.gpu.kit.tabby import BRANCHES

    return {"exl3": [c.name for c in exl3_cases()], "tabby": [BRANCHES["main"]["case"]],
            "llamacpp": [c.name for c in llamacpp_cases()], "exl2": [c.name for c in exl2_cases([4.0, 6.0], 80.0)],
            "tabby-exl2": [BRANCHES["exl2"]["case"]]}


def verified(rows_path: Path) -> set[str]:
    """Cases whose last committed row is ``ok``, or ``infeasible`` with its reason."""
    latest = RowLog(rows_path).latest() if rows_path.exists() else {}
    return {c for c, r in latest.items() if r["row"]["status"] == "ok"
            or (r["row"]["status"] == "infeasible" and r["row"].get("reason"))}


def plan(rows_path: Path, here: Path | None = None) -> list[tuple[str, list[str]]]:
    """(step, its unverified cases) for every step with one, in :data:`STEPS` order.

    ``here``: this machine's rows (the state folder's), verified by an earlier command of
    this lease; a second command does not plan them again.
    """
    done = verified(rows_path) | (verified(here) if here else set())
    out = []
    for step, names in step_cases().items():
        todo = [n for n in names if n not in done]
        if todo:
            out.append((step, todo))
    return out


def has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and Path("/dev/nvidia0").exists()


def archive(work: Path, out: Path) -> Path:
    """``logs.tgz``: the state folder's logs and JSON (each under 4 MB), written atomically."""
    tmp = out / ".logs.tgz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        if work.exists():
            for p in sorted(work.rglob("*")):
                if p.is_file() and p.suffix in (".log", ".json", ".jsonl", ".yml") and p.stat().st_size < 4 << 20:
                    tar.add(p, arcname=str(p.relative_to(work)))
    os.replace(tmp, out / "logs.tgz")
    return out / "logs.tgz"


def run_check(stages: list[str], engine: str, out: Path, work: Path, seconds: float) -> int:
    """``kit.check --stage ...`` in a child process, so a crash ends the step, not the lease."""
    argv = [sys.executable, "-m", "bench.gpu.kit.check", "--stage", *stages, "--engines", engine,
            "--out", str(out), "--work", str(work), "--total-s", f"{seconds:.0f}", "--timeout", "120"]
    try:
        return subprocess.run(argv, check=False, timeout=seconds + 60).returncode
    except subprocess.TimeoutExpired:
        print(f"step cut off after {seconds:.0f} s: run the lease again to go on", flush=True)
        return 124


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu.kit.lease", description=__doc__.splitlines()[0])
    ap.add_argument("--total-s", type=float, default=540.0, help="this command's whole budget")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "gpu" / "out"))
    ap.add_argument("--work", default=str(default_state()))
    ap.add_argument("--rows", default=str(COMMITTED), help="the committed rows the plan starts from")
    ap.add_argument("--steps", nargs="*", choices=list(STEPS), help="run these, planned or not")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    todo = [(s, []) for s in a.steps] if a.steps else plan(Path(a.rows), work / "rows.jsonl")
    gpu = has_gpu()
    print("plan: " + ("; ".join(f"{s} ({len(c)} unverified)" if c else s for s, c in todo) or "nothing left"),
          flush=True)
    if not gpu:
        print("dry run: no GPU here (nvidia-smi / /dev/nvidia0 missing)", flush=True)
    for step, _ in todo:
        engine, stages, cap = STEPS[step]
        left = a.total_s - (time.monotonic() - t0) - RESERVE_S
        if left < 30:
            print(f"== {step}: skipped, {left:.0f} s left: run the lease again on this machine", flush=True)
            continue
        t1 = time.monotonic()
        print(f"== {step} (at most {min(cap, left):.0f} s)", flush=True)
        if step in TABBY_STEPS:
            from bench.gpu.kit.tabby import run as tabby_run

            tabby_run(TABBY_STEPS[step], work, out, RowLog(work / "rows.jsonl", out / "rows.jsonl"),
                      cuda=gpu, timeout_s=min(cap, left))
        elif gpu:
            run_check(stages, engine, out, work, min(cap, left))
        else:
            print(f"skipped on CPU: {step}'s stages {' '.join(stages)} need a GPU", flush=True)
        run_check(["table"], engine, out, work, 60)
        archive(work, out)
        print(f"== {step} done in {time.monotonic() - t1:.0f} s; logs.tgz and the table written", flush=True)
    (out / "lease.json").write_text(json.dumps({"plan": todo, "gpu": gpu, "wall_s": time.monotonic() - t0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
