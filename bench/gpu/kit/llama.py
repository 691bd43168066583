"""The lease's llama.cpp step: ``llama-server`` built with CUDA from the carried source, timed.

The source is ``bench/gpu/llama.cpp`` (llama-cpp-python's vendored llama.cpp, trimmed here:
:mod:`bench.gpu.kit.sources`); the build goes to ``<state>/llama-build`` with the same
cmake options as :mod:`autotune.engines.llama_server.build` plus ``GGML_CUDA=on`` for this
GPU's architecture only (``nvidia-smi``'s compute capability: 9.0 -> ``90``), so nvcc compiles
one architecture, not every one. ninja-less cmake resumes a build a killed command left half
done; ``autotune doctor``'s llama-server line for the build (it must say CUDA) is kept in
``llama.json``. The tiny GGUF (``bench/gpu/gguf/tiny-f16.gguf``) becomes variant ``gg`` of the rows
(:func:`bench.gpu.kit.check.llamacpp_cases`), the tiny MoE (``tiny-moe.gguf``) variant ``moe``
(:func:`bench.gpu.kit.check.moe_cases`), run by the ``llama_server`` engine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from autotune._files import write_atomic
from autotune.engines.llama_server.build import BASE_ARGS
from autotune.engines.llama_server.build import cpu_cmake_flags
from bench.gpu.kit.prepare import run_step
from bench.gpu.kit.stages import ROOT
from bench.gpu.kit.stages import Deadline
from bench.gpu.kit.stages import load_json

SOURCE = ROOT / "bench" / "gpu" / "llama.cpp"
GGUF = ROOT / "bench" / "gpu" / "gguf" / "tiny-f16.gguf"
MOE_GGUF = ROOT / "bench" / "gpu" / "gguf" / "tiny-moe.gguf"  # autotune.tools.make_tiny_moe


def binary(work: Path) -> Path:
    """Where the CUDA ``llama-server`` of this machine is (or will be)."""
    return work / "llama-build" / "bin" / "llama-server"


def cuda_arch() -> str | None:
    """This machine's first GPU's architecture for CMAKE_CUDA_ARCHITECTURES (``90``), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    cap = out.strip().splitlines()[0].strip() if out.strip() else ""
    return cap.replace(".", "") if cap.replace(".", "").isdigit() else None


def cmake_argv(src: Path, build: Path, arch: str, cpuinfo: str) -> list[str]:
    """The configure command: the cached build's options, CUDA on, one architecture."""
    gen = ["-G", "Ninja"] if shutil.which("ninja") and not (build / "Makefile").exists() else []
    return ["cmake", "-S", str(src), "-B", str(build), *gen, *BASE_ARGS, *cpu_cmake_flags(cpuinfo),
            "-DGGML_CUDA=on", f"-DCMAKE_CUDA_ARCHITECTURES={arch}"]


def build(work: Path, deadline: Deadline, src: Path = SOURCE) -> str:
    """Configure and build; '' when ``llama-server`` is there, else why not. Times it."""
    state = load_json(work / "llama.json", {})
    if binary(work).is_file():
        return ""
    if not (src / "CMakeLists.txt").is_file():
        return f"no llama.cpp source at {src} (bash bench/gpu/prepare.sh here, then carry it)"
    arch = cuda_arch()
    if arch is None:
        return "no NVIDIA GPU (nvidia-smi gave no compute capability)"
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    bdir = work / "llama-build"
    t0 = time.monotonic()
    why = run_step(cmake_argv(src, bdir, arch, cpuinfo), deadline.timeout(120), work / "llama-cmake.log")
    if not why:
        why = run_step(["cmake", "--build", str(bdir), "--target", "llama-server", "-j", str(os.cpu_count() or 1)],
                       deadline.timeout(1800), work / "llama-build.log")
    spent = time.monotonic() - t0
    state.update(arch=arch, build_s=state.get("build_s", 0.0) + spent, error=why)
    if not why:
        state["doctor"] = doctor_line(work)
    write_atomic(work / "llama.json", json.dumps(state))
    print(f"llama-server CUDA build (sm_{arch}): {'done' if not why else why} in {spent:.0f} s", flush=True)
    return why


def doctor_line(work: Path) -> str:
    """What ``autotune doctor`` says of this build (its llama-server check, the build on PATH)."""
    from autotune.cli._checks import check_llama_server

    os.environ["PATH"] = f"{binary(work).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    check = check_llama_server()[0]
    line = f"autotune doctor: {check.name}: {check.verdict}: {check.detail}"
    print(line, flush=True)
    return line


def register_gguf(work: Path, gguf: Path = GGUF, moe: Path = MOE_GGUF) -> bool:
    """Add the carried tiny GGUFs to the rows' variants: the dense one as ``gg``, the MoE as
    ``moe``; False when the dense one was not carried (a missing one's rows say so)."""
    path = work / "variants.json"
    variants = load_json(path, {})
    variants.update({name: {"path": str(f)} for name, f in (("gg", gguf), ("moe", moe)) if f.is_file()})
    write_atomic(path, json.dumps(variants, indent=1))
    return gguf.is_file()
