"""What ``autotune doctor`` checks for an engine: the :class:`Check` record, and the checks the
CUDA engines share (ExLlamaV2, ExLlamaV3 and TabbyAPI need the same torch, extension and kernels).

Each engine returns its own checks from :meth:`autotune.engines.base.Engine.doctor_checks` (the
table) and :meth:`~autotune.engines.base.Engine.gate_checks` (before a run); the CLI holds no
branch on an engine's kind. No check imports an engine's library into this process: ExLlamaV2
JIT-compiles its extension on import, so it is looked up with ``importlib.util.find_spec`` and
torch is asked in a subprocess.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from dataclasses import asdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.engines.cuda_ext import JitExtension

VERDICTS = ("ok", "warn", "fail", "skip")


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


def torch_cuda(timeout_s: float = 90.0) -> tuple[str, str | None, bool] | str:
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


def kernels_check(label: str, ext: JitExtension, how_long: str, engines: tuple[str, ...]) -> Check:
    """Whether a library's JIT CUDA kernels are built (the pre-flight builds them otherwise)."""
    if ext.is_built():
        return Check(label, "ok", "built", "", engines)
    return Check(label, "warn", f"not built: compiled (nvcc + ninja, {how_long}) before the first trial",
                 f"{sys.executable} -c 'import {ext.module}'", engines)


def check_exllama() -> list[Check]:
    from autotune.engines.cuda_ext import EXLLAMAV2
    from autotune.engines.cuda_ext import EXLLAMAV3

    eng = ("exllamav2",)
    torch_engines = ("exllamav2", "exllamav3")
    v2 = version_of("exllamav2")
    if v2 is None or importlib.util.find_spec("exllamav2") is None:
        out = [Check("ExLlamaV2", "fail", "not installed", "pip install 'autotune[gpu]'", eng)]
    else:
        out = [Check("ExLlamaV2", "ok", f"exllamav2 {v2}", "", eng)]
        out.append(kernels_check("ExLlamaV2 extension", EXLLAMAV2, "minutes", eng))
    fa = version_of("flash-attn") or version_of("flash_attn")
    out.append(Check("flash-attn", "ok" if fa else "warn",
                     f"flash-attn {fa} (paged generator)" if fa else "absent: ExLlamaV2 runs unpaged "
                     "(no batching of requests)", "" if fa else "pip install flash-attn --no-build-isolation",
                     ()))
    v3 = version_of("exllamav3")
    v3_eng = ("exllamav3",)
    out.append(Check("ExLlamaV3", "ok" if v3 else "fail", f"exllamav3 {v3}" if v3 else "not installed",
                     "" if v3 else "pip install exllamav3", v3_eng))
    if v3:
        out.append(kernels_check("ExLlamaV3 kernels", EXLLAMAV3, "over 5 minutes", v3_eng))
    if version_of("torch") is None:
        out.append(Check("torch CUDA", "fail", "torch is not installed", "pip install torch", torch_engines))
        return out
    torch = torch_cuda()
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


def installed_check(engine: str, fix: str) -> list[Check]:
    """A fail when ``engine``'s Python package cannot be found (before a run: fast)."""
    if importlib.util.find_spec(engine) is None:
        return [Check(engine, "fail", "not installed", fix, (engine,))]
    return []
