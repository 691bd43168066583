"""The CPU side of the offline GPU check: cases, specs, rows, the table, a run with no GPU,
and (where torch + transformers are installed) making the target and draft models.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.registry import get_engine_class
from autotune.trial.spec import TrialResult
from autotune.trial.spec import TrialSpec
from bench.gpu.kit.check import DRAFT
from bench.gpu.kit.check import TARGET
from bench.gpu.kit.check import Case
from bench.gpu.kit.check import Row
from bench.gpu.kit.check import exl2_cases
from bench.gpu.kit.check import llamacpp_cases
from bench.gpu.kit.check import main
from bench.gpu.kit.check import make_spec
from bench.gpu.kit.check import render_table
from bench.gpu.kit.check import row_of


def test_cases_cover_the_issue_matrix() -> None:
    cases = exl2_cases([4.0, 6.0], 80.0)
    names = [c.name for c in cases]
    assert names[:2] == ["exl2 4bpw base", "exl2 6bpw base"]
    params = [c.params for c in cases]
    assert {p["cache_mode"] for p in params} == {"FP16", "Q8", "Q4"}
    drafts = [(p["draft_model"], p["num_draft_tokens"]) for p in params if p.get("draft_model")]
    assert sorted(drafts) == [("d", 2), ("d", 4), ("t4", 4)]  # the model as its own draft: acceptance ~1
    assert any(p.get("layer_skip_threshold", 1.0) < 1.0 for p in params)
    assert {p["gpu_split"] for p in params} == {"auto", "8"}
    assert {p.get("paged") for p in params} == {None, True, False}
    assert max(c.concurrency for c in cases) == 4
    llama = llamacpp_cases("/x/llama-server")
    assert {c.engine for c in llama} == {"llama_server"} and {c.settings["binary"] for c in llama} == {"/x/llama-server"}
    lp = [c.params for c in llama]
    assert {p["n_gpu_layers"] for p in lp} == {"all", "2"} and {p["flash_attn"] for p in lp} == {"on", "off"}
    assert any(p.get("cache_type_k") == "q8_0" for p in lp) and {p.get("parallel") for p in lp} == {None, 1, 4}
    moe = [c for c in llama if c.params["model"] == "moe"]  # issue 44: experts of 0, half, all layers in RAM
    assert [c.params["n_cpu_moe"] for c in moe] == [0, 2, 4] and {c.params["n_gpu_layers"] for c in moe} == {"all"}


@pytest.mark.parametrize("case", exl2_cases([4.0, 6.0], 24.0) + llamacpp_cases(), ids=lambda c: c.name)
def test_every_case_passes_its_engine_check(case: Case) -> None:
    engine = get_engine_class(case.engine)
    assert engine.check(case.params, case.settings) == []


def test_spec_round_trips_through_json(tmp_path: Path) -> None:
    case = exl2_cases([4.0, 6.0], 80.0)[-1]
    spec = make_spec(3, case, {"t4": {"path": "/x"}}, tmp_path, 32, 120)
    back = TrialSpec.from_json(spec.to_json())
    assert back.engine == "exllamav2" and back.params == case.params
    assert back.workload.concurrency == 4 and back.workload.max_tokens == 32
    assert back.workdir == str(tmp_path / "trial-03") and back.timeout_s == 120


def test_rows_and_table() -> None:
    case = Case("exl2 4bpw base", "exllamav2", {})
    ok = row_of(case, TrialResult(0, "ok", {"decode_tps": 1234.5, "ttft_p50_ms": 3.21, "vram_peak_gb": 0.52,
                                            "accept_rate": 0.8}, info={"generator_mode": "non-paged: x"}))
    assert ok == Row("exl2 4bpw base", "exllamav2", "ok", 1234.5, 3.21, 0.52, 0.8, "non-paged: x")
    bad = row_of(case, TrialResult(1, "infeasible", reason="out of GPU memory: a|b\nmore"))
    table = render_table([ok, bad])
    lines = table.splitlines()
    assert lines[0].startswith("| case | engine | status | decode tok/s | TTFT p50 ms | VRAM GiB | accept |")
    assert "| 1.23e+03 | 3.21 | 0.52 | 0.8 |" in lines[2]
    assert lines[3].endswith("| infeasible | - | - | - | - | out of GPU memory: a/b |")


def test_without_a_gpu_every_row_is_skipped_with_its_reason(tmp_path: Path, capsys) -> None:
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is here: run the real check")
    assert main(["--out", str(tmp_path), "--work", str(tmp_path / "work")]) == 0
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert data["environment"]["cuda"] is False
    assert {r["status"] for r in data["rows"]} == {"skipped"}
    assert all("no CUDA GPU" in r["reason"] for r in data["rows"])
    assert "| exl2 4bpw base | exllamav2 | skipped |" in (tmp_path / "gpu_check.md").read_text()


def test_target_and_draft_share_the_vocabulary(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from bench.gpu.kit.check import make_models

    models = make_models(tmp_path)
    cfg = {k: json.loads((p / "config.json").read_text()) for k, p in models.items()}
    assert cfg["target"]["vocab_size"] == cfg["draft"]["vocab_size"]
    assert (models["target"] / "tokenizer.json").read_text() == (models["draft"] / "tokenizer.json").read_text()
    assert (cfg["target"]["hidden_size"], cfg["target"]["num_hidden_layers"]) == (TARGET["hidden_size"], 4)
    assert (cfg["draft"]["hidden_size"], cfg["draft"]["num_hidden_layers"]) == (DRAFT["hidden_size"], 2)
    assert cfg["target"]["head_dim"] == 64 and cfg["target"]["torch_dtype" if "torch_dtype" in cfg["target"]
                                                          else "dtype"] == "float16"


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"optuna", "hydra", "omegaconf", "ray", "mlflow", "gguf"}:
            raise ImportError("not on the GPU machine: " + name)
sys.meta_path.insert(0, Block())
import bench.gpu.kit.check, autotune.trial.worker
from autotune.registry import get_engine_class
get_engine_class("exllamav2"), get_engine_class("llamacpp")
"""


def test_the_check_imports_nothing_the_gpu_machine_lacks() -> None:
    """GPU_MACHINE.md: no optuna, hydra, omegaconf, ray, mlflow or gguf there."""
    done = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2], check=False)
    assert done.returncode == 0, done.stderr[-2000:]
