"""llama.cpp's CUDA rules on CPU: flash-attention K/V pairs and GPU renumbering after Ray."""

from __future__ import annotations

import pytest

from autotune.engines.llamacpp.engine import LlamaCppEngine
from autotune.engines.llamacpp.gpu import fa_pair_reasons
from autotune.engines.llamacpp.gpu import visible_count
from autotune.engines.llamacpp.gpu import visible_split


@pytest.mark.parametrize(
    ("k", "v", "ok"),
    [("f16", "f16", True), ("q8_0", "q8_0", True), ("q4_0", "q4_0", True), ("f32", "f16", True),
     ("q8_0", "q4_0", False), ("f16", "q8_0", False), ("q4_1", "q4_1", False), ("q5_0", "q5_0", False)],
)
def test_cuda_flash_attention_pairs(k: str, v: str, ok: bool) -> None:
    p = {"n_gpu_layers": -1, "flash_attn": True, "type_k": k, "type_v": v}
    assert (fa_pair_reasons(p) == []) is ok
    assert fa_pair_reasons(p, all_quants=True) == []
    assert fa_pair_reasons({**p, "n_gpu_layers": 0}) == []  # CPU: the rule is CUDA's


def test_the_rule_is_part_of_the_engine_check() -> None:
    reasons = LlamaCppEngine.check({"n_gpu_layers": 99, "flash_attn": True, "type_k": "q8_0", "type_v": "q4_0"}, {})
    assert any("GGML_CUDA_FA_QUANTS" in r for r in reasons)


@pytest.mark.parametrize(
    ("split", "main", "n", "expected"),
    [
        ([3, 1], 1, 2, ([3, 1], 1)),  # already in the trial's numbering
        ([0, 3, 1], 2, 2, ([3, 1], 1)),  # zero entry dropped, main_gpu follows its device
        ([0, 0, 5], 2, 1, ([5], 0)),
        ([2, 0, 1], 1, 2, ([2, 1], 0)),  # main_gpu on a dropped device -> 0
        (None, 3, 1, (None, 0)),  # a single visible GPU is 0
        ([1, 1], 1, None, ([1, 1], 1)),  # CUDA_VISIBLE_DEVICES unset: nothing to renumber
    ],
)
def test_split_and_main_gpu_in_visible_numbering(split, main, n, expected) -> None:
    new_split, new_main, _ = visible_split(split, main, n)
    assert (new_split, new_main) == expected


def test_split_needing_more_gpus_than_visible_is_refused() -> None:
    with pytest.raises(ValueError, match="2 are visible"):
        visible_split([1, 1, 1], 0, 2)


@pytest.mark.parametrize(("env", "n"), [({}, None), ({"CUDA_VISIBLE_DEVICES": "3,5"}, 2),
                                        ({"CUDA_VISIBLE_DEVICES": ""}, 0)])
def test_visible_count(env: dict, n) -> None:
    assert visible_count(env) == n
