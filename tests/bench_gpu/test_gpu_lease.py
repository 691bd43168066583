"""The GPU lease kit on CPU: the plan from the committed rows, the archive, the trimmed
llama.cpp source, the tiny GGUF in a real llama-server, and the whole lease as a dry run.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest

from bench.gpu.kit.lease import COMMITTED
from bench.gpu.kit.lease import archive
from bench.gpu.kit.lease import has_gpu
from bench.gpu.kit.lease import plan
from bench.gpu.kit.llama import cmake_argv
from bench.gpu.kit.sources import keep_llama

ROOT = Path(__file__).resolve().parents[2]


def _row(case: str, status: str, reason: str = "") -> str:
    return json.dumps({"row": {"case": case, "engine": "x", "status": status, "reason": reason}}) + "\n"


def test_the_plan_starts_from_the_committed_rows() -> None:
    """The H200 lease verified ExLlamaV2 but its self-draft row: the rest is still to do."""
    steps = dict(plan(COMMITTED))
    assert list(steps) == ["exl3", "tabby", "llamacpp", "exl2", "tabby-exl2"]
    assert steps["exl2"] == ["exl2 4bpw draft self K4"]  # `paged on` infeasible with its reason counts
    assert "exl3 4bpw draft self K4" in steps["exl3"]


def test_verified_steps_drop_out_and_a_later_failure_counts(tmp_path: Path) -> None:
    from bench.gpu.kit.check import exl3_cases

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(_row(c.name, "ok") for c in exl3_cases()) + _row("tabby main exl3 chat", "ok"))
    assert [s for s, _ in plan(rows)] == ["llamacpp", "exl2", "tabby-exl2"]
    with open(rows, "a") as f:
        f.write(_row("exl3 4bpw base", "failed", "boom"))  # the last row of a case counts
    assert plan(rows)[0] == ("exl3", ["exl3 4bpw base"])
    here = tmp_path / "here.jsonl"  # a first command on this machine verified it again
    here.write_text(_row("exl3 4bpw base", "ok"))
    assert [s for s, _ in plan(rows, here)] == ["llamacpp", "exl2", "tabby-exl2"]


def test_the_archive_holds_logs_and_json_not_models(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "trial-00").mkdir(parents=True)
    out.mkdir()
    (work / "trial-00" / "trial.log").write_text("log")
    (work / "variants.json").write_text("{}")
    (work / "model.safetensors").write_bytes(b"0" * 1000)
    with tarfile.open(archive(work, out)) as t:
        assert sorted(t.getnames()) == ["trial-00/trial.log", "variants.json"]


def test_the_trimmed_llama_source_keeps_the_build_and_drops_the_rest() -> None:
    for kept in ("CMakeLists.txt", "ggml/src/ggml-cuda/fattn.cu", "ggml/src/ggml-cpu/ggml-cpu.c",
                 "ggml/src/ggml.c", "tools/server/server.cpp", "tools/ui/CMakeLists.txt", "vendor/cpp-httplib/httplib.h"):
        assert keep_llama(kept), kept
    for dropped in ("models/ggml-vocab-llama-bpe.gguf", "docs/build.md", "ggml/src/ggml-vulkan/x.cpp",
                    "ggml/src/ggml-metal/ggml-metal.m", "tests/test-backend-ops.cpp"):
        assert not keep_llama(dropped), dropped


def test_the_cuda_build_names_one_architecture(tmp_path: Path) -> None:
    argv = cmake_argv(tmp_path / "src", tmp_path / "b", "90", "flags : avx2 fma")
    assert "-DGGML_CUDA=on" in argv and "-DCMAKE_CUDA_ARCHITECTURES=90" in argv
    assert "-DLLAMA_BUILD_SERVER=ON" in argv and "-DBUILD_SHARED_LIBS=OFF" in argv
    assert ("-G" in argv) == (shutil.which("ninja") is not None)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_tiny_gguf_loads_in_a_real_llama_server(tmp_path: Path) -> None:
    """Written with the gguf package (no converter, no torch) and answered by llama-server."""
    pytest.importorskip("gguf")
    pytest.importorskip("tokenizers")
    from autotune.engines.cuda_ext import end_group
    from autotune.engines.llama_server.build import find_binary
    from bench.gpu.kit.sources import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert path.stat().st_size < 10 * 2**20
    binary = find_binary()
    if binary is None:
        pytest.skip("no llama-server: run `python -m autotune.engines.llama_server.build`")
    port = _port()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([str(binary), "--model", str(path), "--host", "127.0.0.1", "--port", str(port),
                             "-t", "1", "-c", "512"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
                time.sleep(0.5)
        body = json.dumps({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
        answer = json.loads(urllib.request.urlopen(req, timeout=60).read())
        assert answer["usage"]["completion_tokens"] > 0  # the chat template and the vocabulary work
    finally:
        end_group(proc)
        log.close()


def test_the_whole_lease_as_a_dry_run_on_cpu(tmp_path: Path) -> None:
    """`bash bench/gpu/lease.sh` without a GPU: exit 0, every GPU step says it was skipped."""
    if has_gpu():
        pytest.skip("a GPU is here: the lease runs for real")
    out, work = tmp_path / "out", tmp_path / "work"
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu" / "lease.sh")], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, check=False,
                          env={**os.environ, "OUT": str(out), "LEASE_WORK": str(work)})
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    assert ("plan: exl3 (5 unverified); tabby (1 unverified); llamacpp (9 unverified); exl2 (1 unverified); "
            "tabby-exl2 (1 unverified)") in text
    for step in ("exl3", "llamacpp", "exl2"):
        assert f"skipped on CPU: {step}'s stages" in text
    for case in ("tabby main exl3 chat", "tabby exl2-checkpoint exl2 chat"):
        assert f"{case}: skipped no CUDA GPU: tabbyapi.yml exported" in text or \
            f"{case}: skipped no TabbyAPI source" in text
    assert {"lease.log", "logs.tgz", "gpu_check.md", "rows.jsonl"} <= {p.name for p in out.iterdir()}
    from autotune.engines.tabbyapi.check import check_tabby_yaml

    for branch in ("main", "exl2"):  # TabbyAPI's own config models (per branch) accept the exports
        assert check_tabby_yaml(out / f"export-{branch}" / "tabbyapi.yml") == []


def test_a_llama_cpp_row_runs_through_the_llama_server_engine(tmp_path: Path) -> None:
    """One of the lease's llama.cpp rows, here on the CPU build and the tiny GGUF: the row, the
    flags it asked for, and the server's own buffer sizes (a q8_0 KV cache)."""
    pytest.importorskip("gguf")
    from autotune.engines.llama_server.build import find_binary
    from bench.gpu.kit.check import llamacpp_cases
    from bench.gpu.kit.check import run_case
    from bench.gpu.kit.sources import write_tiny_gguf

    binary = find_binary()
    if binary is None:
        pytest.skip("no llama-server: run `python -m autotune.engines.llama_server.build`")
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    case = next(c for c in llamacpp_cases(str(binary)) if "q8_0" in c.name)
    row, raw = run_case(case, {"gg": {"path": str(gguf)}}, tmp_path, 8, 120, {}, 0)
    assert row.status == "ok" and row.decode_tps > 0, raw
    argv = raw["info"]["server_argv"]
    assert argv[argv.index("--cache-type-k") + 1] == "q8_0" and "-lv" in argv
    assert any(k.endswith(" KV") for k in raw["info"]["server_buffers_mib"])
    assert row.reason.startswith("server buffers MiB: ")


def test_the_moe_rows_run_through_the_llama_server_engine_with_the_prediction_beside(tmp_path: Path) -> None:
    """Issue 44's GPU rows, here on the CPU build: the tiny MoE with the experts of 0, 2 and 4
    of its layers kept in RAM. Each row runs, asked for ``--n-cpu-moe N`` (none for 0, the
    server's default), and carries the
    tensor table's GPU share, which falls by one layer's experts per layer moved; on CPU the
    server's whole model is one host buffer of the file's tensors."""
    pytest.importorskip("gguf")
    from autotune.engines.llama_server.build import find_binary
    from autotune.engines.llamacpp.moe import layer_table
    from autotune.tools.make_tiny_moe import write_moe_gguf
    from bench.gpu.kit.check import moe_cases
    from bench.gpu.kit.check import run_case
    from bench.gpu.kit.llama import register_gguf

    binary = find_binary()
    if binary is None:
        pytest.skip("no llama-server: run `python -m autotune.engines.llama_server.build`")
    moe = write_moe_gguf(tmp_path / "tiny-moe.gguf")
    register_gguf(tmp_path, tmp_path / "absent.gguf", moe)
    variants = json.loads((tmp_path / "variants.json").read_text())
    assert variants == {"moe": {"path": str(moe)}}
    table = layer_table(moe)
    rows = [run_case(c, variants, tmp_path, 8, 120, {}, i) for i, c in enumerate(moe_cases(str(binary)))]
    predicted = [raw["predicted_gpu_model_mib"] for _, raw in rows]
    for (row, raw), n in zip(rows, (0, 2, 4), strict=True):
        assert row.status == "ok" and row.decode_tps > 0, raw
        argv = raw["info"]["server_argv"]
        assert (argv[argv.index("--n-cpu-moe") + 1] == str(n)) if n else "--n-cpu-moe" not in argv  # 0: default
        assert row.reason.startswith("server buffers MiB: ") and "predicted GPU model" in row.reason
        host = sum(v for k, v in raw["info"]["server_buffers_mib"].items() if k.endswith(" model"))
        assert host == pytest.approx(moe.stat().st_size / 2**20, rel=0.05)
    per_layer = table["experts"][0] / 2**20
    assert predicted[0] - predicted[1] == pytest.approx(2 * per_layer, abs=0.01)
    assert predicted[1] - predicted[2] == pytest.approx(2 * per_layer, abs=0.01)
    assert predicted[2] == pytest.approx((sum(table["dense"]) + table["output"]) / 2**20, abs=0.01)


def test_exl2_checkpoint_is_known_to_refuse_a_cuda_13_torch() -> None:
    """TabbyAPI exl2-checkpoint's is_torch_cuda_13 turns exllamav2 off; the lent machines have
    torch 2.11.0+cu130, so the step says so instead of starting it."""
    from bench.gpu.kit import tabby

    assert "CUDA 13 torch (2.11.0+cu130" in tabby.refused_here("exl2", "2.11.0+cu130")
    assert tabby.refused_here("main", "2.11.0+cu130") == ""
    assert tabby.refused_here("exl2", "2.9.0+cu128") == ""
    assert tabby.refused_here("exl2") == ""  # this machine's CPU torch (or none)
    src = ROOT / "bench" / "gpu" / "tabbyAPI-exl2" / "common" / "optional_dependencies.py"
    if src.is_file():  # the prepared source still says so
        assert "is_torch_cuda_13()" in src.read_text()
