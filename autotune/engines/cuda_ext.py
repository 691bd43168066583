"""Build an engine's CUDA extension in the pre-flight, before any trial and its timeout.

exllamav2 0.3.2 and exllamav3 compile their kernels (``exllamav2_ext``, ``exllamav3_ext``)
with ``torch.utils.cpp_extension.load`` the first time ``<package>.ext`` is imported, unless a
prebuilt module of that name is installed. That takes minutes and needs nvcc + ninja (on an
H200 with 16 cores: exllamav2 101 s; exllamav3 over 5 minutes). Inside a timed trial it
times out, and a build killed half-way leaves torch's ``lock`` file in
``<TORCH_EXTENSIONS_DIR or ~/.cache/torch_extensions>/<py_cu>/<name>/``, on which every later
build waits forever (``torch.utils.file_baton.FileBaton``); the offline GPU check lost a
second exllamav3 build to that. :func:`build_extension` removes such a stale lock, builds in
a subprocess with its own timeout, removes the lock of a build it kills and says so on the
console. Ninja keeps the objects a killed build finished: the next build goes on from them.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autotune._process_group import kill_group


@dataclass(frozen=True)
class JitExtension:
    """A library's kernels that torch compiles on first import."""

    package: str  # what is installed: "exllamav2"
    module: str  # importing it builds (or loads) the kernels: "exllamav2.ext"
    name: str  # torch's build folder, and a prebuilt module's name: "exllamav2_ext"
    install: str  # how to install the package

    def is_built(self) -> bool:
        """A prebuilt module, or a finished JIT build under :func:`extensions_root`."""
        return importlib.util.find_spec(self.name) is not None or any(
            extensions_root().glob(f"*/{self.name}/{self.name}*.so"))


EXLLAMAV2 = JitExtension("exllamav2", "exllamav2.ext", "exllamav2_ext", "pip install 'autotune[gpu]'")
EXLLAMAV3 = JitExtension("exllamav3", "exllamav3.ext", "exllamav3_ext", "pip install exllamav3")


def extensions_root() -> Path:
    """Where torch builds JIT extensions (``cpp_extension.get_default_build_root``)."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "torch_extensions"


def _cwd_users(folder: Path) -> bool:
    """Whether a running process works inside ``folder`` (ninja/nvcc of a build run there)."""
    folder = folder.resolve()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cwd = Path(os.readlink(proc / "cwd"))
        except OSError:
            continue
        if cwd == folder or folder in cwd.parents:
            return True
    return False


def stale_locks(root: Path, name: str, min_age_s: float = 60.0,
                busy: Callable[[Path], bool] = _cwd_users) -> list[Path]:
    """Lock files of ``name`` builds that nobody is running (older than ``min_age_s``)."""
    now = time.time()
    out = []
    for lock in sorted(root.glob(f"*/{name}/lock")):
        try:
            age = now - lock.stat().st_mtime
        except OSError:
            continue
        if age >= min_age_s and not busy(lock.parent):
            out.append(lock)
    return out


def build_extension(ext: JitExtension, timeout_s: float = 1800.0, python: str | None = None,
                    say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> list[str]:
    """Make sure importing ``ext.package`` will not compile; returns what is missing ([] if ready)."""
    pkg = ext.package
    if importlib.util.find_spec(pkg) is None:
        return [f"{pkg} is not installed ({ext.install}, see docs/gpu.md)"]
    if importlib.util.find_spec(ext.name) is not None:
        return []  # a prebuilt extension wheel
    for lock in stale_locks(extensions_root(), ext.name):
        say(f"{pkg}: removing a stale build lock left by an interrupted build: {lock}")
        lock.unlink(missing_ok=True)
    say(f"{pkg}: building/loading its CUDA extension before the first trial "
        f"(first use compiles with nvcc: minutes; limit {timeout_s:g} s) ...")
    t0 = time.monotonic()
    proc = subprocess.Popen([python or sys.executable, "-c", f"import {ext.module}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            start_new_session=True)  # its own group: nvcc/ninja die with it
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        end_group(proc)
        for lock in extensions_root().glob(f"*/{ext.name}/lock"):  # the build we killed held it
            lock.unlink(missing_ok=True)
        return [f"{pkg}'s CUDA extension did not build within {timeout_s:g} s "
                "(engine.settings.extension_build_timeout_s); a new build resumes it"]
    end_group(proc)
    if proc.returncode != 0:
        tail = " | ".join((stderr or stdout).strip().splitlines()[-3:])
        return [f"{pkg}'s CUDA extension does not build or load: {tail}"]
    say(f"{pkg}: CUDA extension ready ({time.monotonic() - t0:.0f} s)")
    return []


def end_group(proc: subprocess.Popen) -> None:
    """End a child's whole process group at once (nvcc, ninja: no grace to give) and reap it."""
    kill_group(proc.pid, grace_s=0)
    proc.communicate()
