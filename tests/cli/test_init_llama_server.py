"""``autotune init --engine llama_server``: a serving preset for the real llama-server.

The preset maximises goodput at a TTFT bound (workload ``slo``) over llama-server's slots and
batching knobs; trial 0 is the server's own defaults; a dry run never builds the binary.
"""

from __future__ import annotations

import re
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


def _space_line(text: str, key: str) -> str:
    return next(x for x in text.splitlines() if x.strip().startswith(f"{key}:"))


def test_a_moe_file_gets_n_cpu_moe_around_the_predicted_fit_boundary(tmp_path, a3b_header) -> None:
    from autotune.engines.llama_server.predict import predict_llama_server

    proc = run_cli_here(["init", str(a3b_header), "--engine", "llama_server", "--gpus", "RTX 4080:16",
                         "--out", "conf", "--name", "moe"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (tmp_path / "conf" / "moe.yaml").read_text()
    space = yaml.safe_load(text)["space"]
    picks = space["n_cpu_moe"]["choices"]
    assert picks[0] == 0 and space["n_cpu_moe"]["ordered"]  # llama-server's default: trial 0
    boundary = int(re.search(r"predicted fit boundary (\d+)", _space_line(text, "n_cpu_moe")).group(1))
    assert boundary in picks and picks[1:] == sorted(x for x in (boundary - 4, boundary - 2, boundary,
                                                                 boundary + 2, boundary + 4) if x >= 1)
    settings = {"gpus": [{"name": "RTX 4080", "memory_gb": 16.0}]}
    variants = {"m": {"path": str(a3b_header)}}

    def fits(n: int) -> bool | None:
        p = LlamaServerEngine.full_params({"model": "m", "n_cpu_moe": n}, settings, variants)
        return predict_llama_server(p, settings, variants).fits

    assert 0 < boundary < 48 and fits(boundary) is not False and fits(boundary - 1) is False
    assert space["spec_type"]["choices"] == ["none", "ngram-simple", "ngram-mod"]
    assert "#" in _space_line(text, "spec_type")
    dry = run_cli_here(["run", "--config-dir", "conf", "conf=moe", "--dry-run"], tmp_path)
    assert dry.returncode == 0 and "nothing was written" in dry.stdout, dry.stdout + dry.stderr


def test_a_dense_file_gets_no_moe_knob_and_a_cpu_box_no_expert_placement(tmp_path, gemma_path,
                                                                       tiny_moe) -> None:
    proc = run_cli_here(["init", str(gemma_path), "--engine", "llama_server", "--gpus", "RTX 4080:16",
                         "--out", "conf", "--name", "dense"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dense = yaml.safe_load((tmp_path / "conf" / "dense.yaml").read_text())["space"]
    assert "n_gpu_layers" in dense and not {"n_cpu_moe", "cpu_moe", "spec_type"} & set(dense)
    proc = run_cli_here(["init", str(tiny_moe), "--engine", "llama_server", "--out", "conf",
                         "--name", "cpu_moe"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (tmp_path / "conf" / "cpu_moe.yaml").read_text()
    space = yaml.safe_load(text)["space"]
    assert "n_cpu_moe" not in space and "spec_type" in space
    assert "expert placement (n_cpu_moe, cpu_moe) has no effect" in text


def test_kv_types_the_models_heads_cannot_take_are_left_out_with_the_reason(tmp_path, tiny_moe) -> None:
    """The tiny MoE's 16-wide heads take no 32-element quantized KV block (llama.cpp refuses the
    context): both engines' presets keep f16 only, say why, and their dry runs pass."""
    for engine, k, v in (("llama_server", "cache_type_k", "cache_type_v"), ("llamacpp", "type_k", "type_v")):
        proc = run_cli_here(["init", str(tiny_moe), "--engine", engine, "--out", "conf", "--name", engine],
                            tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        text = (tmp_path / "conf" / f"{engine}.yaml").read_text()
        assert not {k, v} & set(yaml.safe_load(text)["space"]), engine
        assert (f"# {k}, {v}: f16 only; q8_0, q4_0 left out: this model's heads (16 wide) are not a "
                "multiple of llama.cpp's quantized KV block (32)") in text, text


def test_two_cards_get_a_tensor_split_by_bytes(a3b_header) -> None:
    """--n-cpu-moe empties the first layers while the default split counts layers: on two
    10 GB cards the first sits nearly empty and the boundary is far out; a split by bytes that
    gives card 0 more layers fits with fewer experts in RAM."""
    from autotune.engines.model_files import read_model

    ms = group_models([read_model(str(a3b_header))])
    card = {"name": "RTX 3080", "memory_gb": 10.0, "bandwidth_gbps": 760}
    text = llama_server_preset(ms, Box(8, 16, 60.0, 60.0, (card, dict(card)), True), "moe2", "conf")
    space = yaml.safe_load(text)["space"]
    choices = space["tensor_split"]["choices"]
    assert choices[0] == ""  # llama-server's default (by free memory): trial 0
    first, second = (int(x) for x in choices[1].split(","))
    assert first > second
    n_line = _space_line(text, "n_cpu_moe")
    b = int(re.search(r"predicted fit boundary (\d+)", n_line).group(1))
    b2 = int(re.search(r"; (\d+) with a tensor_split by bytes", n_line).group(1))
    assert b2 < b and {b, b2} <= set(space["n_cpu_moe"]["choices"])
    line = _space_line(text, "tensor_split")
    full, default = (int(x) for x in re.search(r"at (\d+)% with .*, (\d+)% with the default",
                                               line).groups())
    assert full <= 100 < default, line
    cfg, _space, baseline = check_preset(text, "moe2")
    assert baseline["tensor_split"] == "" and baseline["n_cpu_moe"] == 0
