"""``autotune init --engine llama_server``: a serving preset for the real llama-server.

The preset maximises goodput at a TTFT bound (workload ``slo``) over llama-server's slots and
batching knobs; trial 0 is the server's own defaults; a dry run never builds the binary.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from autotune.cli.init import check_preset
from autotune.engines.llama_server.engine import LlamaServerEngine
from autotune.engines.llama_server.preset import llama_server_preset
from autotune.engines.model_files import ModelFile
from autotune.engines.model_files import group_models
from autotune.engines.presets import Box
from tests.helpers.cli import run_cli_here


def test_init_writes_a_serving_preset_whose_dry_run_passes(tmp_path, gemma_path) -> None:
    proc = run_cli_here(["init", "--engine", "llama_server", "--out", "conf", "--name", "srv"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (tmp_path / "conf" / "srv.yaml").read_text()
    preset = yaml.safe_load(text)
    assert preset["defaults"][1] == {"engine": "llama_server"} and preset["defaults"][2] == {"workload": "slo"}
    assert preset["objectives"] == ["goodput_tps"]
    assert "max_concurrency_at_slo >= 1" in preset["constraints"]
    assert preset["space"]["parallel"]["choices"][0] == -1  # llama-server's default: trial 0
    assert "n_gpu_layers" not in preset["space"]  # no GPU here
    for key in ("parallel", "threads", "ubatch_size", "cache_type_v"):  # every range says why
        line = next(x for x in text.splitlines() if x.strip().startswith(f"{key}:"))
        assert "#" in line, line
    assert "trial 0: the baseline {'parallel': -1" in proc.stdout.replace("\n", " ")
    dry = run_cli_here(["run", "--config-dir", "conf", "conf=srv", "--dry-run"], tmp_path)
    assert dry.returncode == 0 and "nothing was written" in dry.stdout, dry.stdout + dry.stderr
    assert not (tmp_path / "studies").exists()


def test_a_gpu_box_gets_more_slots_and_offload_around_the_fit_boundary(tmp_path) -> None:
    def qwen(quant: str, bpw: float, size_gb: float) -> ModelFile:
        return ModelFile(tmp_path / f"qwen-7b-{quant}.gguf", "gguf", "qwen2", "Qwen2.5 7B", 28, 32768,
                         quant.upper(), bpw, size_gb, 7.6e9, 152064, 3584)

    ms = group_models([qwen("q4_k_m", 4.85, 4.4), qwen("q8_0", 8.5, 7.5)])
    for vram, whole in ((24, True), (4, False)):
        box = Box(8, 16, 60.0, 60.0, ({"name": "RTX 4090", "memory_gb": vram, "bandwidth_gbps": 1008},), True)
        text = llama_server_preset(ms, box, "qwen", "conf")
        preset = yaml.safe_load(text)
        ngl = preset["space"]["n_gpu_layers"]["choices"]
        assert ngl[0] == "auto" and (ngl == ["auto", "all"]) == whole, ngl
        assert all(x in ("auto", "all") or 1 <= int(x) <= 28 for x in ngl)
        assert preset["space"]["parallel"]["choices"][-1] == 16
        assert sorted(preset["space"]["model"]["choices"]) == ["q4_k_m", "q8_0"] and "speed alone" in text
        cfg, space, baseline = check_preset(text, "qwen")
        assert baseline["n_gpu_layers"] == "auto" and baseline["parallel"] == -1
        assert cfg.workload.slo.ttft_p95_ms == 1000


def test_a_dry_run_never_builds_the_server() -> None:
    missing = Path("/nonexistent/llama-server")
    assert LlamaServerEngine.preflight({"binary": str(missing)}, build=False) == []
    real = LlamaServerEngine.preflight({"binary": str(missing)})  # a real run: says it is missing
    assert real and "/nonexistent/llama-server" in real[0]
    assert "--parallel 4" in LlamaServerEngine.describe_launch(
        {"model": "m", "parallel": 4}, {"binary": str(missing)}, {"m": {"path": "/m.gguf"}})
