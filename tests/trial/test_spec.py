"""TrialSpec carries frozen WorkloadSpec / QualitySpec records; JSON is only the wire form."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.measure.spec import MixClass
from autotune.measure.spec import QualitySpec
from autotune.measure.spec import SLOSpec
from autotune.measure.spec import WorkloadSpec
from autotune.trial import TrialSpec
from autotune.trial import run_trial


def spec(tmp_path, workload, quality=None, params=None) -> TrialSpec:
    return TrialSpec(number=3, engine="fake", settings={}, variants={},
                     params=params or {"x": 0.0, "y": 0.3}, workload=workload,
                     quality=quality or QualitySpec(enabled=False), timeout_s=120,
                     workdir=str(tmp_path / "w"))


def test_records_round_trip_through_json(tmp_path):
    wl = WorkloadSpec(mix=(MixClass(100, 500, 2.0),), seed=9, load="slo",
                      slo=SLOSpec(ttft_p95_ms=200.0, error_rate=0.01), context_ladder=())
    s = spec(tmp_path, wl, QualitySpec(text="t.txt", n_tokens=64, reference_dir="/r"))
    back = TrialSpec.from_json(s.to_json())
    assert back == s
    assert isinstance(back.workload.slo, SLOSpec) and isinstance(back.workload.mix[0], MixClass)
    assert back.quality.reference_dir == "/r"
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.workload.max_tokens = 3  # type: ignore[misc]


def test_plain_mappings_become_records_with_the_schema_defaults(tmp_path):
    s = spec(tmp_path, {"prompts": "short", "max_tokens": 8}, {"enabled": False})
    assert s.workload == WorkloadSpec(prompts="short", max_tokens=8)
    assert s.quality == QualitySpec(enabled=False)


def test_the_config_section_is_the_record():
    from autotune.config.schema import WorkloadConfig

    assert WorkloadConfig is WorkloadSpec


def test_a_slo_trial_runs_in_the_worker_process(tmp_path):
    # 36-token requests (~180 ms): a second user on one slot waits at least 90 ms on average
    # (tests/run/test_serving_study.py says why), a served one's first token comes in 4 ms
    wl = WorkloadSpec(max_tokens=36, repeats=2, load="slo", slo=SLOSpec(ttft_p95_ms=60.0),
                      max_concurrency=8, search_time_s=60)
    result = run_trial(spec(tmp_path, wl, params={"x": 0.0, "y": 0.3, "max_batch": 1}))
    assert result.status == "ok", result.reason + result.log_tail
    assert result.metrics["max_concurrency_at_slo"] == 1
    assert result.metrics["goodput_tps"] > 0
    assert [r["level"] for r in result.samples["search"]][:2] == [1.0, 2.0]


@pytest.mark.parametrize(
    ("workload", "says"),
    [
        (WorkloadSpec(), "5 measured rounds at concurrency 1"),
        (WorkloadSpec(turns=10, max_tokens=32), "10-turn conversations"),
        (WorkloadSpec(mix=(MixClass(100, 500),), seed=4), "100/500 (seed 4)"),
        (WorkloadSpec(arrival="poisson", rate=2.0), "Poisson arrivals at 2 req/s"),
        (WorkloadSpec(load="slo", slo=SLOSpec(ttft_p95_ms=200), max_concurrency=8),
         "the most load (1 to 8 users, 180 s) meeting ttft_p95_ms <= 200, error_rate <= 0"),
    ],
)
def test_describe_says_the_shape_and_the_load(workload, says):
    assert says in workload.describe()
