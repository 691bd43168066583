"""``autotune doctor``: the real checks on this machine, the decisions on facts, the run gate.

The decisions are pure functions of facts (a GPU list and the offload flag; a decode
process's exit status and the CPU's flags), so they are tested on those facts: a real
subprocess that dies with SIGSEGV stands in for a crashing ``llama_decode``.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from autotune.cli._checks import check_load
from autotune.cli._checks import check_mlflow
from autotune.cli._checks import physical_cores
from autotune.cli.doctor import blocking
from autotune.engines.doctor import Check
from autotune.engines.llamacpp.doctor import DECODED
from autotune.engines.llamacpp.doctor import FACTS
from autotune.engines.llamacpp.doctor import cpu_flags
from autotune.engines.llamacpp.doctor import decode_check
from autotune.engines.llamacpp.doctor import offload_check
from autotune.engines.llamacpp.doctor import rebuild_command
from autotune.engines.llamacpp.doctor import smoke_decode
from autotune.engines.vllm.gpu import check_vllm
from tests.conftest import study_overrides
from tests.helpers.cli import run_cli_here

AMX_CPU = ("processor\t: 0\nflags\t\t: fpu sse sse2 avx f16c fma avx2 bmi2 avx512f avx512vbmi "
           "avx512_vnni avx512_bf16 avx_vnni amx_bf16 amx_tile amx_int8\n")
NO_AMX_REBUILD = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON '
    "-DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON "
    '-DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON" pip install --no-cache-dir --force-reinstall '
    "--no-deps llama-cpp-python==0.3.36")


def _dies_with(sig: int, build: str = "") -> list[str]:
    """A process that prints the build facts (as the smoke script does), then dies of ``sig``."""
    facts = json.dumps({"version": "0.3.36", "offload": False, "system_info": build})
    return [sys.executable, "-c", f"import os; print({FACTS!r} + {facts!r}, flush=True); "
            f"os.kill(os.getpid(), {int(sig)})"]


def test_a_segfault_on_an_amx_cpu_names_the_amx_path_and_the_no_amx_rebuild() -> None:
    out = smoke_decode(_dies_with(signal.SIGSEGV, "CPU : AVX2 = 1 | AMX_INT8 = 1 |"), timeout_s=30)
    assert out.returncode == -signal.SIGSEGV
    check = decode_check(out, cpu_flags(AMX_CPU), "0.3.36", "/m/gemma.gguf")
    assert check.verdict == "fail"
    assert "SIGSEGV" in check.detail and "ggml_backend_amx_mul_mat" in check.detail
    assert "amx_int8" in check.detail and "gemma.gguf" in check.detail
    assert check.fix == NO_AMX_REBUILD
    assert "\n" not in check.line()


@pytest.mark.parametrize(("sig", "build", "cpuinfo", "cause"), [
    (signal.SIGILL, "", "flags : avx avx2", "an instruction this CPU lacks"),
    (signal.SIGSEGV, "", "flags : avx avx2", "a broken llama.cpp build"),
    (signal.SIGSEGV, "CPU : AVX2 = 1 |", AMX_CPU, "a broken llama.cpp build"),  # built without AMX
])
def test_other_crashes_name_their_cause(sig: int, build: str, cpuinfo: str, cause: str) -> None:
    check = decode_check(smoke_decode(_dies_with(sig, build), 30), cpu_flags(cpuinfo), "0.3.36")
    assert check.verdict == "fail" and cause in check.detail
    assert check.fix.startswith('CMAKE_ARGS="-DGGML_NATIVE=OFF') and "AMX" not in check.fix


def test_a_hung_decode_is_killed_and_failed() -> None:
    out = smoke_decode([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=1)
    assert out.timed_out and out.seconds < 30
    assert decode_check(out, set(), "0.3.36").verdict == "fail"


def test_a_decode_that_prints_its_token_passes() -> None:
    out = smoke_decode([sys.executable, "-c", f"print({DECODED!r})"], 30)
    assert decode_check(out, set(), "0.3.36").verdict == "ok"


def test_the_rebuild_for_this_cpu_has_no_amx() -> None:
    cmd = rebuild_command(cpu_flags(), "0.3.36")
    assert "-DGGML_NATIVE=OFF" in cmd and "AMX" not in cmd and "llama-cpp-python==0.3.36" in cmd


@pytest.mark.parametrize(("gpus", "offload", "verdict"), [
    (["NVIDIA GeForce RTX 4090"], False, "fail"),  # the 6.56 tok/s case
    (["NVIDIA GeForce RTX 4090"], True, "ok"),
    ([], False, "ok"),
    ([], True, "ok"),
    (["NVIDIA GeForce RTX 4090"], None, "skip"),
])
def test_gpu_offload_decision(gpus: list[str], offload: bool | None, verdict: str) -> None:
    check = offload_check(gpus, offload, cpu_flags("flags : avx avx2"), "0.3.36")
    assert check.verdict == verdict
    if verdict == "fail":
        assert "RTX 4090" in check.detail and "on the CPU" in check.detail
        assert check.fix == ('CMAKE_ARGS="-DGGML_CUDA=on" pip install --no-cache-dir '
                             "--force-reinstall --no-deps llama-cpp-python==0.3.36")


def test_the_cuda_rebuild_on_an_amx_cpu_also_turns_amx_off() -> None:
    fix = offload_check(["RTX 4090"], False, cpu_flags(AMX_CPU), "0.3.36").fix
    assert fix.startswith('CMAKE_ARGS="-DGGML_CUDA=on -DGGML_NATIVE=OFF -DGGML_AVX=ON')


def test_blocking_counts_only_the_engines_checks() -> None:
    checks = [Check("a", "fail", "x", "fix a", ("exllamav2",)), Check("b", "warn", "y", "", ("llamacpp",))]
    assert blocking(checks, "llamacpp") == []
    assert [c.name for c in blocking(checks, "exllamav2")] == ["a"]


def test_facts_of_this_machine() -> None:
    assert physical_cores() >= 1
    assert physical_cores("physical id\t: 0\ncore id\t: 0\nphysical id\t: 0\ncore id\t: 0\n") == 1


def test_mlflow_store_under_a_file_is_not_writable(tmp_path) -> None:
    (tmp_path / "afile").write_text("x")
    check = check_mlflow(f"sqlite:///{tmp_path}/afile/mlflow.db")[0]
    assert check.verdict == "fail" and check.fix
    assert check_mlflow(f"sqlite:///{tmp_path}/new/mlflow.db")[0].verdict == "ok"


@pytest.mark.parametrize(("args", "needle"), [
    (["doctor", "--engine", "llamcpp"], "Did you mean: llamacpp"),
    (["doctor", "--model", "/no/such.gguf"], "--model: got '/no/such.gguf'"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args: list[str], needle: str) -> None:
    proc = run_cli_here(args, tmp_path)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr


def test_run_stops_on_a_failed_check_before_writing_and_dry_run_does_not_check(tmp_path) -> None:
    if check_vllm()[0].verdict == "ok":
        pytest.skip("vLLM is installed here: its check passes and the run would start")
    (tmp_path / "tiny").mkdir()
    args = ["run", "conf=vllm_cpu", *study_overrides(tmp_path), f"engine.variants.tiny.path={tmp_path}/tiny"]
    proc = run_cli_here(args, tmp_path)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(lines) == 1 and lines[0].startswith("autotune: error: doctor: vLLM: fail:"), lines
    assert "fix: bash .ci/install_vllm.sh" in lines[0] and not (tmp_path / "studies").exists()
    assert run_cli_here([*args, "--dry-run"], tmp_path).returncode == 0


@pytest.mark.slow
def test_doctor_on_this_machine_passes_for_llamacpp_and_reports_the_rest(cli) -> None:
    proc = cli("doctor", "--json", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    by_name = {c["name"]: c for c in report["checks"]}
    assert report["ready"] and by_name["llama.cpp decode"]["verdict"] == "ok", by_name["llama.cpp decode"]
    assert all(c["fix"] for c in report["checks"] if c["verdict"] == "fail")
    other = cli("doctor", "--engine", "exllamav2", timeout=300)
    assert "Traceback" not in other.stderr + other.stdout
    failed = [c for c in report["checks"] if c["verdict"] == "fail" and "exllamav2" in c["engines"]]
    assert other.returncode == (1 if failed else 0), other.stdout
    assert ("exllamav2: not ready" in other.stdout) == bool(failed)


FAKE_CUDA_SERVER = """#!/bin/sh
# FAKE llama-server: a CUDA build cannot run on this CPU box; this prints what llama.cpp's
# common_print_available_devices prints for one on an H100 (common/arg.cpp)
printf 'Available devices:\\n  CUDA0: NVIDIA H100 80GB HBM3 (81079 MiB, 80562 MiB free)\\n'
"""


def test_doctor_says_whether_llama_server_is_a_cuda_build(tmp_path, monkeypatch) -> None:
    from autotune.engines.llama_server import build

    fake = tmp_path / "llama-server"
    fake.write_text(FAKE_CUDA_SERVER)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")  # the engine's own lookup finds it
    (check,) = build.check_llama_server()
    assert check.verdict == "ok" and check.detail == f"{fake} (CUDA build: CUDA0: NVIDIA H100 80GB HBM3 (81079 MiB, 80562 MiB free))"
    fake.write_text("#!/bin/sh\nprintf 'Available devices:\\n  (none)\\n'\n")  # what a CPU build prints
    assert build.check_llama_server()[0].detail == f"{fake} (CPU build)"


@pytest.mark.parametrize(("load", "cpus", "verdict"), [
    (4.6, 2, "warn"),   # the default study beside two benchmark jobs: no trial met TTFT p95 <= 300 ms
    (1.0, 2, "warn"),   # one of two cores taken
    (0.9, 2, "ok"),
    (3.0, 16, "ok"),    # under half of the CPUs
    (9.0, 16, "warn"),
])
def test_a_busy_machine_is_a_warning_naming_the_load(load: float, cpus: int, verdict: str) -> None:
    check = check_load(load, cpus)
    assert check.verdict == verdict
    assert f"load average {load:.1f} over {cpus} usable CPUs" in check.detail
    if verdict == "warn":
        assert "(1 min): busy, so timings are slower" in check.detail
        assert check.fix == "run when the machine is idle"


def test_the_run_checks_the_load_of_this_machine_before_it_starts(tmp_path) -> None:
    from autotune.cli.doctor import gate_checks
    from autotune.config.compose import compose
    from autotune.config.schema import load_config

    cfg = load_config(compose(["conf=local_cpu", f"study.dir={tmp_path}/s", "tracking.enabled=false"]))
    load = next(c for c in gate_checks(cfg) if c.name == "CPU load")
    assert load.verdict in ("ok", "warn") and "usable CPUs (1 min)" in load.detail
    assert list(tmp_path.iterdir()) == []
