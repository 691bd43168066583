"""ExLlamaV2Engine: the pure parts on CPU (load plan, split validation, layer-skip selection);
the real engine on a CUDA GPU only (``AUTOTUNE_EXL2_MODEL`` = an EXL2 model directory).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.engines.exllamav2.engine import ExLlamaV2Engine
from autotune.engines.exllamav2.engine import filter_modules
from autotune.engines.exllamav2.engine import load_plan
from autotune.engines.exllamav2.engine import parse_split
from autotune.engines.exllamav2.engine import select_skips
from autotune.engines.exllamav2.engine import skip_candidates
from autotune.engines.exllamav2.engine import split_reasons
from autotune.registry import get_engine_class

HYDRA = {"gpus": [{"name": "RTX 5090", "memory_gb": 32}, {"name": "RTX 4090", "memory_gb": 24}]}


def params(**kw) -> dict:
    return ExLlamaV2Engine.full_params(kw, HYDRA, {"m": {"path": "/m"}})


def test_registry_resolves_exllamav2_without_importing_it() -> None:
    import sys

    assert get_engine_class("exllamav2") is ExLlamaV2Engine
    assert "exllamav2" not in sys.modules  # the module imports exllamav2 only in start()


@pytest.mark.parametrize(
    ("value", "expected"),
    [("auto", ("auto", [])), (None, ("auto", [])), ("tp", ("tp", [])), ([30, 22], ("manual", [30.0, 22.0])),
     ("30,22", ("manual", [30.0, 22.0])), ("30.5, 21", ("manual", [30.5, 21.0]))],
)
def test_parse_split(value, expected) -> None:
    assert parse_split(value) == expected


@pytest.mark.parametrize("value", ["fast", [], "30,x", {"a": 1}])
def test_parse_split_rejects(value) -> None:
    with pytest.raises(ValueError, match="gpu_split"):
        parse_split(value)


@pytest.mark.parametrize(
    ("split", "n_reasons"),
    [([30, 22], 0), ([31.5, 23.5], 0), ([32, 24], 2), ([30, 26], 1), ([33, 25], 2), ([20, 20, 10], 1)],
)
def test_split_reasons_against_the_resource_plan(split, n_reasons) -> None:
    """gpu_split is GiB (exllamav2 model.py::set_device_map: a * 1024**3), as memory_gb; 0.5 GiB stays free."""
    assert len(split_reasons([float(x) for x in split], HYDRA["gpus"])) == n_reasons


@pytest.mark.parametrize(("split", "ok"), [([20, 32], False), ([24, 31], False), ([23, 31], True),
                                           ([8], True), ([10, 10, 10], False)])
def test_split_reasons_per_device(split, ok) -> None:
    """The cases of the former cluster.check_gpu_split, now the one GPU-split check."""
    devices = [{"name": "RTX 4090", "memory_gb": 24}, {"name": "RTX 5090", "memory_gb": 32}]
    assert (split_reasons(split, devices) == []) is ok


def test_load_plan_maps_knobs_to_exllamav2_arguments() -> None:
    plan = load_plan(params(max_seq_len=5000, cache_mode="Q6", chunk_size=1024, gpu_split="30,22",
                            draft_model="d", draft_cache_mode="Q4", num_draft_tokens=6), HYDRA)
    assert plan["mode"] == "manual" and plan["gpu_split"] == [30.0, 22.0]
    assert plan["cache_class"] == "ExLlamaV2Cache_Q6"
    assert plan["cache_size"] == 5120  # rounded up to a multiple of 256
    assert (plan["max_input_len"], plan["max_attention_size"]) == (1024, 1024**2)
    assert plan["generator"] == {"max_batch_size": None, "max_chunk_size": 1024, "max_seq_len": 5000,
                                 "paged": True, "num_draft_tokens": 6}
    assert plan["draft"] == {"variant": "d", "cache_class": "ExLlamaV2Cache_Q4"}
    assert plan["reserve_vram"] == [96 * 1024**2, 0]


def test_load_plan_tp_disables_graphs() -> None:
    plan = load_plan(params(gpu_split="tp"), HYDRA)
    assert (plan["mode"], plan["no_graphs"], plan["draft"]) == ("tp", True, None)


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [
        ({"gpu_split": "30,26"}, "puts 26 GiB on it"),
        ({"paged": False, "max_batch_size": 4}, "needs paged=true"),
        ({"chunk_size": 1000}, "multiple of 256"),
        ({"cache_mode": "FP8"}, "cache_mode='FP8'"),
        ({"num_draft_tokens": 9}, "num_draft_tokens=9"),
        ({"max_batch_size": 512, "chunk_size": 2048}, "max_batch_size"),
        ({"gpu_split": "tp", "layer_skip_threshold": 0.98}, "tensor parallel"),
        ({"cache_size": 2048, "max_seq_len": 4096}, "cache_size=2048"),
        ({"gpu_split": "sideways"}, "gpu_split"),
    ],
)
def test_check_reasons(kw: dict, fragment: str) -> None:
    reasons = ExLlamaV2Engine.check(kw, HYDRA)
    assert any(fragment in r for r in reasons), reasons


def test_check_accepts_a_valid_config() -> None:
    assert ExLlamaV2Engine.check({"gpu_split": "30,22", "cache_mode": "Q4", "max_seq_len": 16384}, HYDRA) == []
    assert ExLlamaV2Engine.check({"gpu_split": "tp"}, {"gpus": [{"name": "x", "memory_gb": 24}]}) == [
        "gpu_split=tp needs at least 2 GPUs"]


@pytest.mark.parametrize(
    ("kw", "gpus"),
    [({"gpu_split": "auto"}, 2.0), ({"gpu_split": "tp"}, 2.0), ({"gpu_split": [24]}, 1.0), ({"gpu_split": "30,22"}, 2.0)],
)
def test_resources(kw: dict, gpus: float) -> None:
    assert ExLlamaV2Engine.resources(kw, HYDRA).num_gpus == gpus


def test_layer_skip_selection_uses_the_middle_half() -> None:
    assert list(skip_candidates(8)) == [2, 3, 4, 5]
    sims = [0.999, 0.999, 0.99, 0.97, 0.995, 0.981, 0.999, 0.6]
    assert select_skips(sims, 0.98) == [2, 4, 5]
    assert select_skips(sims, 1.0) == [] and select_skips(sims, None) == []


class FakeModule:
    """A named stand-in for an exllamav2 module (the real ones need CUDA)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def test_filter_modules_drops_whole_layers_and_fixes_indices() -> None:
    n = 4
    mods = [FakeModule("emb")] + [FakeModule(f"{k}{i}") for i in range(n) for k in ("attn", "mlp")]
    mods += [FakeModule("norm"), FakeModule("head")]
    starts = [1 + 2 * i for i in range(n)] + [1 + 2 * n]
    kept, head, last_kv = filter_modules(mods, starts, [1, 2])
    assert [m.name for m in kept] == ["emb", "attn0", "mlp0", "attn3", "mlp3", "norm", "head"]
    assert (head, last_kv) == (6, 3)


# ---- real GPU ---------------------------------------------------------------------------------
def _cuda_or_skip() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    pytest.importorskip("exllamav2", reason="exllamav2 not installed (pip install autotune[gpu])")
    if not os.environ.get("AUTOTUNE_EXL2_MODEL"):
        pytest.skip("set AUTOTUNE_EXL2_MODEL to an EXL2 model directory")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("extra", [{}, {"cache_mode": "Q4", "layer_skip_threshold": 0.9}])
def test_exllamav2_real_trial(tmp_path: Path, extra: dict) -> None:
    _cuda_or_skip()
    from autotune.trial.runner import run_trial
    from autotune.trial.spec import TrialSpec

    spec = TrialSpec(
        number=0, engine="exllamav2", settings={}, variants={"m": {"path": os.environ["AUTOTUNE_EXL2_MODEL"]}},
        params={"model": "m", "max_seq_len": 2048, **extra},
        workload={"prompts": "short", "max_tokens": 32, "warmup": 1, "repeats": 3, "ignore_eos": True},
        quality={"enabled": False}, timeout_s=600, workdir=str(tmp_path / "trial"),
    )
    result = run_trial(spec)
    assert result.status == "ok", result.reason + "\n" + result.log_tail
    assert result.metrics["decode_tps"] > 0 and result.metrics["vram_peak_gb"] > 0
    assert result.samples["output_tokens"] == [32] * 3
    if "layer_skip_threshold" in extra:
        assert "skipped_layers" in result.info
