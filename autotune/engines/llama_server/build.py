"""Find or build the real ``llama-server`` (and ``llama-bench``) without the network.

Order: ``engine.settings.binary``, then ``llama-server`` on ``PATH``, then a cached build,
then a build from the llama.cpp sources vendored in the installed llama-cpp-python's source
distribution (``pip download --no-binary :all:`` from the configured index), so the server
and the binding speak the same llama.cpp version. The build is cached under
``~/.cache/autotune/llama-server/<key>/`` where the key names the llama-cpp-python version
and a hash of the cmake flags (:func:`cache_key`).

On a CPU whose ``/proc/cpuinfo`` lists ``amx_*`` the build names the SIMD extensions
explicitly with ``GGML_NATIVE=OFF`` (llama.cpp's AMX path segfaults on these VMs):
:func:`cpu_cmake_flags` is the pure function that decides. With ``nvcc`` and an NVIDIA GPU
the build adds ``GGML_CUDA=on``.

CLI: ``python -m autotune.engines.llama_server.build [--print-path] [--force]``; it exits 2
with one line when cmake or a C++ compiler is missing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from autotune.engines.doctor import Check
from autotune.engines.variants import cache_dir as models_dir

TARGETS = ("llama-server", "llama-bench")
# /proc/cpuinfo flag -> the GGML cmake option that enables it
SIMD_FLAGS = (("avx", "AVX"), ("avx2", "AVX2"), ("fma", "FMA"), ("f16c", "F16C"), ("bmi2", "BMI2"),
              ("avx512f", "AVX512"), ("avx512vbmi", "AVX512_VBMI"), ("avx512_vnni", "AVX512_VNNI"),
              ("avx512_bf16", "AVX512_BF16"), ("avx_vnni", "AVX_VNNI"))
BASE_ARGS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON",
             "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
             "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DBUILD_SHARED_LIBS=OFF")


def cache_root() -> Path:
    """``~/.cache/autotune/llama-server`` (beside the models folder; ``AUTOTUNE_CACHE`` moves both)."""
    return models_dir().parent / "llama-server"


class BuildError(RuntimeError):
    """The binary can be neither found nor built; the message is one line saying why."""


def cpu_flags(cpuinfo: str) -> set[str]:
    """The CPU feature flags of the first ``flags`` line of a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def cpu_cmake_flags(cpuinfo: str) -> list[str]:
    """cmake options for the CPU backend: [] (native) unless the CPU has AMX.

    With AMX, ``-DGGML_NATIVE=OFF`` and each SIMD extension the CPU lists, named explicitly,
    so ``-march=native`` never turns on llama.cpp's AMX kernels.
    """
    flags = cpu_flags(cpuinfo)
    if not any(f.startswith("amx") for f in flags):
        return []
    return ["-DGGML_NATIVE=OFF"] + [f"-DGGML_{opt}=ON" for flag, opt in SIMD_FLAGS if flag in flags]


def cmake_args(cpuinfo: str, cuda: bool) -> list[str]:
    """Every cmake option of the build (pure: the cache key hashes them)."""
    return list(BASE_ARGS) + cpu_cmake_flags(cpuinfo) + (["-DGGML_CUDA=on"] if cuda else [])


def cache_key(version: str, args: list[str]) -> str:
    """``<llama-cpp-python version>-<12 hex of the cmake options>``: one build per pair."""
    digest = hashlib.sha256("\n".join(args).encode()).hexdigest()[:12]
    return f"{version}-{digest}"


def llama_cpp_version() -> str:
    """The installed llama-cpp-python's version (read from its metadata, no import)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version

    try:
        return version("llama_cpp_python")
    except PackageNotFoundError as e:
        raise BuildError("llama-cpp-python is not installed: its sdist is the llama.cpp source "
                         "to build (pip install llama-cpp-python)") from e


def cuda_available() -> bool:
    """nvcc on PATH and an NVIDIA GPU visible (a CUDA build without a GPU is hours of waste)."""
    return shutil.which("nvcc") is not None and Path("/dev/nvidia0").exists()


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def build_dir(version: str | None = None, cuda: bool | None = None) -> Path:
    """The cache folder of this machine's build (it may not exist yet)."""
    args = cmake_args(_cpuinfo(), cuda_available() if cuda is None else cuda)
    return cache_root() / cache_key(version or llama_cpp_version(), args)


def cached_binary(name: str = "llama-server") -> Path | None:
    """The cached build's ``name`` if it was built, else None."""
    try:
        path = build_dir() / "bin" / name
    except BuildError:
        return None
    return path if path.is_file() and os.access(path, os.X_OK) else None


def find_binary(configured: str | None = None, name: str = "llama-server") -> Path | None:
    """``configured`` (a path or a name on PATH), else ``name`` on PATH, else the cached build."""
    if configured:
        found = shutil.which(configured) or (configured if Path(configured).is_file() else None)
        return Path(found).resolve() if found else None
    on_path = shutil.which(name)
    return Path(on_path) if on_path else cached_binary(name)


def missing_tools() -> list[str]:
    """The build tools this machine lacks (cmake, a C and a C++ compiler)."""
    out = [] if shutil.which("cmake") else ["cmake"]
    if not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        out.append("a C++ compiler (g++ or clang++)")
    if not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        out.append("a C compiler (gcc or clang)")
    return out


def _fetch_sources(version: str, dest: Path) -> Path:
    """Download llama-cpp-python's sdist and unpack its vendor/llama.cpp into ``dest``."""
    src = dest / "llama.cpp"
    if (src / "CMakeLists.txt").is_file():
        return src
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={version}", "-d", tmp]
        p = subprocess.run(cmd, capture_output=True, text=True)
        sdists = list(Path(tmp).glob("*.tar.gz"))
        if p.returncode or not sdists:
            last = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no sdist"]
            raise BuildError(f"cannot download llama-cpp-python=={version}'s sdist: {last[0]}")
        with tarfile.open(sdists[0]) as tar:
            top = tar.getnames()[0].split("/")[0]
            prefix = f"{top}/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(src, members=[m for m in members if m.name], filter="data")
    return src


def _run_build(cmd: list[str], log: Path, progress) -> None:
    """Run one cmake step, its output to ``log``; advance ``progress(percent)`` on "[ NN%]"."""
    with open(log, "a") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            for line in proc.stdout:
                out.write(line)
                m = re.match(r"\[\s*(\d+)%\]", line)
                if m and progress:
                    progress(int(m.group(1)))
            proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    if proc.returncode:
        tail = [x for x in log.read_text().splitlines() if "error" in x.lower()][-1:] or ["see the log"]
        raise BuildError(f"{cmd[0]} failed ({tail[0].strip()}); log: {log}")


def build(force: bool = False, show: bool = True, jobs: int | None = None) -> Path:
    """Build ``llama-server`` and ``llama-bench`` into the cache (once); return llama-server.

    Raises:
        BuildError: a tool is missing, the sdist cannot be fetched, or the build failed.
    """
    version = llama_cpp_version()
    cuda = cuda_available()
    args = cmake_args(_cpuinfo(), cuda)
    out = cache_root() / cache_key(version, args)
    binary = out / "bin" / "llama-server"
    if binary.is_file() and (out / "bin" / "llama-bench").is_file() and not force:
        return binary
    missing = missing_tools()
    if missing:
        raise BuildError(f"cannot build llama-server: missing {', '.join(missing)}")
    out.mkdir(parents=True, exist_ok=True)
    src = _fetch_sources(version, out.parent / f"src-{version}")
    work, log = out / "build", out / "build.log"
    log.write_text(f"# cmake {' '.join(args)}\n")
    from rich.progress import Progress

    with Progress(disable=not show, transient=True) as bar:
        if show:  # a line also where no progress bar is drawn (output to a file or a pipe)
            bar.console.print(f"building llama-server and llama-bench {version} from source, once per "
                              f"version and build options ({os.cpu_count() or 1} cores: several "
                              f"minutes on 2); log: {log}", soft_wrap=True)
        task = bar.add_task(f"building llama-server ({version}, {'CUDA' if cuda else 'CPU'})", total=100)
        _run_build(["cmake", "-S", str(src), "-B", str(work), *args], log, None)
        _run_build(["cmake", "--build", str(work), "--target", *TARGETS, "-j",
                    str(jobs or os.cpu_count() or 1)], log, lambda pct: bar.update(task, completed=pct))
    (out / "bin").mkdir(exist_ok=True)
    for name in TARGETS:
        shutil.copy2(work / "bin" / name, out / "bin" / name)
    return binary


def ensure_binary(configured: str | None = None, show: bool = True) -> Path:
    """The llama-server to run: found (:func:`find_binary`) or built now (:func:`build`)."""
    found = find_binary(configured)
    if found is not None:
        return found
    if configured:
        raise BuildError(f"engine.settings.binary={configured!r} is not an executable file")
    return build(show=show)


def llama_server_devices(path: str) -> list[str]:
    """The devices a llama-server build offers (``--list-devices``: ``CUDA0: NVIDIA H100 ...``);
    [] for a CPU-only build, which lists none."""
    try:
        out = subprocess.run([path, "--list-devices"], capture_output=True, text=True, timeout=60,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    return [x.strip() for x in (out.stdout + out.stderr).splitlines()
            if re.match(r"\s+[A-Za-z]+\d+: ", x)]


def check_llama_server() -> list[Check]:
    """The llama-server binary the engine would use (on PATH or built in the cache), and whether
    it is a CUDA build (its ``--list-devices``)."""
    eng = ("llama_server",)
    path = find_binary()
    if path:
        devices = llama_server_devices(str(path))
        kind = ("CUDA build" if any(d.startswith("CUDA") for d in devices)
                else "GPU build" if devices else "CPU build")
        return [Check("llama-server", "ok", f"{path} ({kind}{': ' + devices[0] if devices else ''})",
                      "", eng)]
    return [Check("llama-server", "warn", "no llama-server binary (on PATH or built in the cache); "
                  "built before the first llama_server trial", "python -m "
                  "autotune.engines.llama_server.build", eng)]


def main(argv: list[str] | None = None) -> int:
    """CLI: build (or find) llama-server and llama-bench; print where they are."""
    ap = argparse.ArgumentParser(prog="python -m autotune.engines.llama_server.build",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    ap.add_argument("--print-path", action="store_true", help="only print llama-server's path")
    ap.add_argument("--jobs", "-j", type=int, default=None, help="parallel jobs (default: cores)")
    a = ap.parse_args(argv)
    try:
        path = build(force=a.force, show=not a.print_path, jobs=a.jobs)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path if a.print_path else f"llama-server: {path}\nllama-bench: {path.parent / 'llama-bench'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
