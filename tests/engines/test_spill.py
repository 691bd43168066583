"""Spill is a failure: a card at its limit with a decode far below the bound is infeasible."""

from __future__ import annotations

import pytest

from autotune.engines.spill import judge
from autotune.engines.spill import spill_reason
from autotune.trial.spec import TrialResult

CARDS = [24.0, 24.0]


@pytest.mark.parametrize(
    ("vram", "tps", "upper", "spilled"),
    [
        ([23.8, 10.0], 6.0, 60.0, True),    # card 0 full, decode 10% of the bound: spilled
        ([10.0, 22.5], 6.0, 60.0, True),    # card 1 at 94%: spilled
        ([23.8, 10.0], 30.0, 60.0, False),  # full but fast: a tight fit, not a spill
        ([20.0, 20.0], 6.0, 60.0, False),   # slow but room left: slow for another reason
        ([23.8, 10.0], 14.9, 60.0, True),   # just under a quarter of the bound
        ([23.8, 10.0], 15.0, 60.0, False),  # a quarter: not far enough below
        ([23.8, 10.0], 6.0, None, False),   # no bound: not judged
        ([23.8, 10.0], None, 60.0, False),  # no decode measured
        ([23.8, 10.0], float("nan"), 60.0, False),
        ([], 6.0, 60.0, False),             # no VRAM reading (a CPU trial)
    ],
)
def test_spill_table(vram, tps, upper, spilled) -> None:
    why = spill_reason(vram, CARDS, tps, upper)
    assert (why is not None) == spilled, why
    if spilled:
        assert why.startswith("spilled into system memory: GPU ")


def test_a_spilled_trial_becomes_infeasible_and_others_stay() -> None:
    settings = {"gpus": [{"name": "RTX 4090", "memory_gb": 24}]}
    ok = TrialResult(3, "ok", {"decode_tps": 5.0}, info={"vram_per_gpu_gb": {"0": 23.5}})
    judged = judge(ok, settings, 80.0)
    assert judged.status == "infeasible" and judged.reason == (
        "spilled into system memory: GPU 0 at 23.5 of 24.0 GB while decode ran 5.0 tok/s, "
        "6% of the predicted 80.0")
    assert judge(ok, settings, 15.0) is ok  # 5 of 15: a third of the bound, no spill
    failed = TrialResult(4, "failed", reason="boom", info={"vram_per_gpu_gb": {"0": 23.5}})
    assert judge(failed, settings, 80.0) is failed
    assert judge(TrialResult(5, "ok", {"decode_tps": 5.0}), settings, 80.0).status == "ok"


def test_a_spill_fills_what_the_card_had_free_at_the_start() -> None:
    """A desktop held 3 GB of the 24: the trial's peak above idle reads 21.0 when it filled the
    card, below 93% of 24 but all of the 21 it had."""
    settings = {"gpus": [{"name": "RTX 4090", "memory_gb": 24}]}
    filled = TrialResult(3, "ok", {"decode_tps": 5.0}, info={"vram_per_gpu_gb": {"0": 21.0}})
    assert judge(filled, settings, 80.0) is filled  # against the whole card: room seemed left
    filled = TrialResult(3, "ok", {"decode_tps": 5.0},
                         info={"vram_per_gpu_gb": {"0": 21.0}, "vram_free_per_gpu_gb": {"0": 21.0}})
    judged = judge(filled, settings, 80.0)
    assert judged.status == "infeasible" and "GPU 0 at 21.0 of 21.0 GB" in judged.reason
