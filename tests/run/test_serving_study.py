"""A whole study that maximises goodput at an SLO, on the fake engine with a known capacity.

The fake engine serves ``max_batch`` requests at once and queues the rest. A served
request's first token comes after 4 ms, so a busy machine has 55 ms of room under the 60 ms
TTFT bound on the side where delays count. A second user on one slot must wait: with 2
sessions a user, until the last session is taken two requests finish (2S) and all that time
one user waits, so the mean TTFT is at least S/2 however the users' phases drift.
36-token requests (S ~ 180 ms) make that 90 ms, over the bound. So each trial's SLO search
finds ``max_concurrency_at_slo == max_batch`` (the ceiling, 4, with no limit), and the
study must rank the trials by the goodput that follows.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import study_overrides
from tests.helpers.cli import run_cli_here

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

PRESET = """
defaults: [base, {engine: fake}, {workload: slo}, _self_]
study: {n_trials: 2, sampler: grid, trial_timeout_s: 120}
space:
  x: {type: fixed, value: 0.0}
  y: {type: fixed, value: 0.3}
  max_batch: {type: categorical, choices: [0, 1]}   # 0: no limit
workload: {max_tokens: 36, repeats: 2, warmup: 0, slo: {ttft_p95_ms: 60}, search_time_s: 30,
           max_concurrency: 4}
objectives: [goodput_tps]
constraints: ["max_concurrency_at_slo >= 1"]
select: {metric: goodput_tps, top_k: 1, rerun_repeats: 1}
quality: {enabled: false}
ray: {num_cpus: 2, num_gpus: 1, max_concurrent: 1}
report: {enabled: false}
"""


def test_a_goodput_study_picks_the_engine_that_serves_the_most_users(tmp_path):
    (tmp_path / "confs").mkdir()
    (tmp_path / "confs" / "serving_fake.yaml").write_text(PRESET)
    args = ["run", "--config-dir", str(tmp_path / "confs"), "conf=serving_fake"]
    proc = run_cli_here([*args, *study_overrides(tmp_path, "serving", seed_mlflow=True)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    d = tmp_path / "studies" / "serving"
    summary = json.loads((d / "summary.json").read_text())
    found = {}
    for result in d.glob("trials/*/result.json"):
        r = json.loads(result.read_text())
        spec = json.loads((result.parent / "spec.json").read_text())
        found[spec["params"]["max_batch"]] = r["metrics"]["max_concurrency_at_slo"]
    assert found == {0: 4, 1: 1}
    winner, base = summary["winner"], summary["baseline"]
    assert winner["params"]["max_batch"] == 0 and base["number"] == 0
    assert winner["metrics"]["max_concurrency_at_slo"] == 4
    assert winner["metrics"]["goodput_tps"] > 0
    assert "goodput_tps" in proc.stdout and "max_concurrency_at_slo" in proc.stdout
