"""The checks of ``autotune doctor`` other than llama.cpp's build: machine, engines, tools.

Each check returns :class:`Check` records (name, verdict, detail, the one command that fixes
it, the engines that need it). None imports an engine's library into this process:
ExLlamaV2 JIT-compiles its extension on import, so it is looked up with
``importlib.util.find_spec`` and torch is asked in a subprocess.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.engines.base import ENGINES
from autotune.hardware import cpu_count
from autotune.hardware import list_gpus

if TYPE_CHECKING:
    from autotune.engines.cuda_ext import JitExtension

VERDICTS = ("ok", "warn", "fail", "skip")
ALL = tuple(ENGINES)
GPU_ENGINES = tuple(e for e in ("exllamav2", "exllamav3", "tabbyapi") if e in ENGINES)


@dataclass(frozen=True)
class Check:
    """One line of ``autotune doctor``: ``verdict`` is ok | warn | fail | skip; ``fix`` the one
    command that fixes a warn or fail; ``engines`` the engines that cannot run without it."""

    name: str
    verdict: str
    detail: str
    fix: str = ""
    engines: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {**asdict(self), "engines": list(self.engines)}

    def line(self) -> str:
        """The check in one line: name, verdict, detail and fix."""
        return f"{self.name}: {self.verdict}: {self.detail}" + (f"; fix: {self.fix}" if self.fix else "")


def version_of(dist: str) -> str | None:
    """The installed version of distribution ``dist`` (None if absent); imports nothing."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def physical_cores(cpuinfo: str | None = None) -> int:
    """Physical cores this process may use: (physical id, core id) pairs, capped by affinity."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return cpu_count()
    cores, phys = set(), "0"
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "physical id":
            phys = value.strip()
        elif key.strip() == "core id":
            cores.add((phys, value.strip()))
    return max(1, min(len(cores) or cpu_count(), cpu_count()))


def check_cpu() -> list[Check]:
    from autotune.engines.predict import ram_available_gb
    from autotune.engines.predict import ram_bandwidth_gbps

    cores = Check("CPU cores", "ok", f"{physical_cores()} physical cores, {cpu_count()} usable CPUs",
                  "", ALL)
    bw = ram_bandwidth_gbps({})
    free = ram_available_gb()
    ram = Check("RAM", "ok", f"{free:.1f} GiB available, {bw:.1f} GB/s (read probe, cached)"
                if free is not None else f"{bw:.1f} GB/s (read probe, cached)", "", ALL)
    return [cores, ram]


def _driver() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver
        return "?"


def check_gpus() -> list[Check]:
    from autotune.engines.predict import gpu_table

    gpus = list_gpus()
    if not gpus:
        return [Check("GPUs", "skip", "no NVIDIA GPU (NVML found no driver); CPU engines only",
                      "install the NVIDIA driver (nvidia-smi must list the GPU)", GPU_ENGINES)]
    driver = _driver()
    out = []
    for g, row in zip(gpus, gpu_table({})):
        bw = row.get("bandwidth_gbps")
        bw_text = f"{bw:g} GB/s (published)" if bw else "bandwidth unknown: set engine.settings.gpus[].bandwidth_gbps"
        out.append(Check(f"GPU {g.index}", "ok" if bw else "warn",
                         f"{g.name}, {g.memory_gb:.1f} GiB, driver {driver}, {bw_text}", "",
                         GPU_ENGINES))
    return out


def _torch_cuda(timeout_s: float = 90.0) -> tuple[str, str | None, bool] | str:
    code = ("import json, torch; print(json.dumps([torch.__version__, torch.version.cuda, "
            "torch.cuda.is_available()]))")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"import torch took over {timeout_s:g} s"
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return tuple(json.loads(done.stdout.strip().splitlines()[-1]))


def _kernels_check(label: str, ext: JitExtension, how_long: str, engines: tuple[str, ...]) -> Check:
    """Whether a library's JIT CUDA kernels are built (the pre-flight builds them otherwise)."""
    if ext.is_built():
        return Check(label, "ok", "built", "", engines)
    return Check(label, "warn", f"not built: compiled (nvcc + ninja, {how_long}) before the first trial",
                 f"{sys.executable} -c 'import {ext.module}'", engines)


def check_exllama() -> list[Check]:
    from autotune.engines.cuda_ext import EXLLAMAV2
    from autotune.engines.cuda_ext import EXLLAMAV3

    eng = ("exllamav2",)
    torch_engines = tuple(e for e in ("exllamav2", "exllamav3") if e in ENGINES)
    v2 = version_of("exllamav2")
    if v2 is None or importlib.util.find_spec("exllamav2") is None:
        out = [Check("ExLlamaV2", "fail", "not installed", "pip install 'autotune[gpu]'", eng)]
    else:
        out = [Check("ExLlamaV2", "ok", f"exllamav2 {v2}", "", eng)]
        out.append(_kernels_check("ExLlamaV2 extension", EXLLAMAV2, "minutes", eng))
    fa = version_of("flash-attn") or version_of("flash_attn")
    out.append(Check("flash-attn", "ok" if fa else "warn",
                     f"flash-attn {fa} (paged generator)" if fa else "absent: ExLlamaV2 runs unpaged "
                     "(no batching of requests)", "" if fa else "pip install flash-attn --no-build-isolation",
                     ()))
    v3 = version_of("exllamav3")
    v3_eng = ("exllamav3",) if "exllamav3" in ENGINES else ()
    out.append(Check("ExLlamaV3", "ok" if v3 else "fail", f"exllamav3 {v3}" if v3 else "not installed",
                     "" if v3 else "pip install exllamav3", v3_eng))
    if v3:
        out.append(_kernels_check("ExLlamaV3 kernels", EXLLAMAV3, "over 5 minutes", v3_eng))
    if version_of("torch") is None:
        out.append(Check("torch CUDA", "fail", "torch is not installed", "pip install torch", torch_engines))
        return out
    torch = _torch_cuda()
    if isinstance(torch, str):
        out.append(Check("torch CUDA", "fail", f"torch does not import: {torch}", "pip install --force-reinstall torch", torch_engines))
    elif torch[1] is None:
        out.append(Check("torch CUDA", "fail", f"torch {torch[0]} is a CPU-only build",
                         "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu128", torch_engines))
    else:
        ok = torch[2]
        out.append(Check("torch CUDA", "ok" if ok else "fail", f"torch {torch[0]}, CUDA {torch[1]}"
                         + ("" if ok else ", but no CUDA device is usable"), "" if ok else "nvidia-smi", torch_engines))
    return out


def check_vllm() -> list[Check]:
    from autotune.engines.vllm.gpu import VENV_PYTHON
    from autotune.engines.vllm.gpu import vllm_build

    here = vllm_build(sys.executable)
    venv = vllm_build(VENV_PYTHON) if VENV_PYTHON.exists() else None
    found = [f"CPU build in {VENV_PYTHON.parent.parent}"] if venv else []
    if here:
        found.append(f"{'CUDA' if here == 'gpu' else 'CPU'} build in this interpreter")
    if found:
        return [Check("vLLM", "ok", "; ".join(found), "", ("vllm",))]
    return [Check("vLLM", "fail", f"no vLLM here nor in {VENV_PYTHON.parent.parent}",
                  "bash .ci/install_vllm.sh (CPU) or pip install vllm (CUDA)", ("vllm",))]


def llama_server_binary() -> str | None:
    """The llama-server the llama_server engine would use (its own lookup), else PATH's."""
    try:
        from autotune.engines.llama_server.build import find_binary

        found = find_binary()
        return str(found) if found else None
    except Exception:  # noqa: BLE001 - that engine absent or mid-change: PATH alone
        return shutil.which("llama-server")


def check_llama_server() -> list[Check]:
    eng = ("llama_server",) if "llama_server" in ENGINES else ()
    path = llama_server_binary()
    if path:
        return [Check("llama-server", "ok", path, "", eng)]
    return [Check("llama-server", "warn", "no llama-server binary (on PATH or built in the cache); "
                  "built before the first llama_server trial", "python -m "
                  "autotune.engines.llama_server.build", eng)]


def check_ray() -> list[Check]:
    v = version_of("ray")
    return [Check("Ray", "ok" if v else "fail", f"ray {v}" if v else "not installed",
                  "" if v else "pip install 'ray[default]'", ALL)]


def writable_dir(path: Path) -> Path | None:
    """The nearest existing folder of ``path`` if this user may write there, else None."""
    p = path.resolve()
    while not p.exists():
        p = p.parent
    return p if p.is_dir() and os.access(p, os.W_OK | os.X_OK) else None


def check_mlflow(uri: str = "sqlite:///mlruns/mlflow.db") -> list[Check]:
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
    elif "://" not in uri or uri.startswith("file://"):
        path = Path(uri.removeprefix("file://")) / "x"
    else:
        return [Check("MLflow store", "skip", f"{uri}: a remote store, not checked", "", ALL)]
    if writable_dir(path.parent) is None:
        return [Check("MLflow store", "fail", f"{path.parent} is not writable ({uri})",
                      f"autotune run tracking.uri=sqlite:///{Path.home()}/mlruns/mlflow.db", ALL)]
    return [Check("MLflow store", "ok", f"{uri} writable", "", ALL)]


def check_chromium() -> list[Check]:
    try:
        from choreographer.browsers.chromium import Chromium

        path = Chromium.find_browser(skip_local=False)
    except Exception:  # noqa: BLE001 - kaleido/choreographer absent or changed
        path = None
    if path:
        return [Check("Chromium", "ok", f"{path} (report PNGs)", "", ())]
    return [Check("Chromium", "warn", "none found: report.html is written, its PNGs are skipped",
                  "apt-get install chromium (or plotly_get_chrome)", ())]
