"""Build exllamav2's CUDA extension in the pre-flight, before any trial and its timeout.

exllamav2 0.3.2 compiles ``exllamav2_ext`` with ``torch.utils.cpp_extension.load`` the first
time ``exllamav2.ext`` is imported, unless a prebuilt ``exllamav2_ext`` module is installed
(``exllamav2/ext.py``: ``build_jit``). That takes minutes and needs nvcc + ninja. Inside a
timed trial it can time out, and a build killed half-way leaves torch's ``lock`` file in
``<TORCH_EXTENSIONS_DIR or ~/.cache/torch_extensions>/<py_cu>/exllamav2_ext/``, on which every
later build waits forever (``torch.utils.file_baton.FileBaton``). :func:`build_extension`
removes such a stale lock, builds in a subprocess with its own timeout and says so on the
console.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

EXT_NAME = "exllamav2_ext"


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


def stale_locks(root: Path, min_age_s: float = 60.0, busy: Callable[[Path], bool] = _cwd_users) -> list[Path]:
    """Lock files of exllamav2_ext builds that nobody is running (older than ``min_age_s``)."""
    now = time.time()
    out = []
    for lock in sorted(root.glob(f"*/{EXT_NAME}/lock")):
        try:
            age = now - lock.stat().st_mtime
        except OSError:
            continue
        if age >= min_age_s and not busy(lock.parent):
            out.append(lock)
    return out


def build_extension(timeout_s: float = 1800.0, python: str | None = None,
                    say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> list[str]:
    """Make sure ``import exllamav2`` will not compile; returns what is missing ([] if ready)."""
    if importlib.util.find_spec("exllamav2") is None:
        return ["exllamav2 is not installed (pip install 'autotune[gpu]', see docs/gpu.md)"]
    if importlib.util.find_spec(EXT_NAME) is not None:
        return []  # a prebuilt extension wheel
    for lock in stale_locks(extensions_root()):
        say(f"exllamav2: removing a stale build lock left by an interrupted build: {lock}")
        lock.unlink(missing_ok=True)
    say("exllamav2: building/loading its CUDA extension before the first trial "
        f"(first use compiles with nvcc: a few minutes; limit {timeout_s:g} s) ...")
    t0 = time.monotonic()
    proc = subprocess.Popen([python or sys.executable, "-c", "import exllamav2.ext"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            start_new_session=True)  # its own group: nvcc/ninja die with it
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        for lock in extensions_root().glob(f"*/{EXT_NAME}/lock"):  # the build we killed held it
            lock.unlink(missing_ok=True)
        return [f"exllamav2's CUDA extension did not build within {timeout_s:g} s "
                "(engine.settings.extension_build_timeout_s); a new build resumes it"]
    _kill_group(proc)
    if proc.returncode != 0:
        tail = " | ".join((stderr or stdout).strip().splitlines()[-3:])
        return [f"exllamav2's CUDA extension does not build or load: {tail}"]
    say(f"exllamav2: CUDA extension ready ({time.monotonic() - t0:.0f} s)")
    return []


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the build's process group (nvcc, ninja) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()
