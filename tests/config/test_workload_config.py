"""The workload section: shipped shapes compose, bad values fail with the key, value and fix."""

from __future__ import annotations

import pytest

from autotune.config.compose import compose
from autotune.config.schema import load_config
from autotune.errors import ConfigError
from autotune.measure.spec import MixClass


@pytest.mark.parametrize("name", ["short", "medium", "long", "code", "concurrent", "multiturn",
                                  "mixed", "long_context", "slo", "poisson"])
def test_shipped_workloads_compose_and_validate(name):
    cfg = load_config(compose(["conf=local_cpu", f"workload={name}"]))
    assert cfg.workload.name == name


def test_seed_shapes_are_declared_as_the_seed_says():
    mixed = load_config(compose(["conf=local_cpu", "workload=mixed"])).workload
    assert mixed.mix == (MixClass(100, 500), MixClass(500, 1000), MixClass(200, 300))
    assert load_config(compose(["conf=local_cpu", "workload=multiturn"])).workload.turns == 10
    ladder = load_config(compose(["conf=local_cpu", "workload=long_context"])).workload
    assert ladder.context_ladder[-1] == 16000


def test_presets_with_serving_workloads():
    cfg = load_config(compose(["conf=serving_cpu"]))
    assert cfg.workload.load == "slo" and cfg.workload.slo.ttft_p95_ms > 0
    assert [o.metric for o in cfg.objectives] == ["goodput_tps"]
    assert load_config(compose(["conf=hydra_cluster", "workload=multiturn"])).workload.turns == 10


@pytest.mark.parametrize(
    ("overrides", "path", "says"),
    [
        (["+workload.arrival=poison"], "workload.arrival", "Did you mean: poisson"),
        (["+workload.arrival=poisson"], "workload.rate", "needs a rate"),
        (["+workload.load=max"], "workload.load", "available: fixed, slo"),
        (["+workload.load=slo"], "workload.slo", "at least one of"),
        (["+workload.slo.ttft_p95=100"], "workload.slo.ttft_p95", "Did you mean: ttft_p95_ms"),
        (["+workload.slo={error_rate:5}"], "workload.slo.error_rate", "[0, 1]"),
        (["+workload.mix=[{prompt_tokens:100}]"], "workload.mix[0].output_tokens", "required"),
        (["+workload.mix=[{prompt_tokens:100,output_tokens:1}]"], "workload.mix[0].output_tokens", ">= 2"),
        (["+workload.turns=3", "+workload.mix=[{prompt_tokens:10,output_tokens:5}]"], "workload.mix",
         "cannot be combined with workload.turns"),
        (["+workload.context_ladder=[4000,1000]"], "workload.context_ladder", "increasing"),
        (["+workload.turns=0"], "workload.turns", "> 0"),
        (["workload=slo", "study.trial_timeout_s=60"], "workload.search_time_s", "below study.trial_timeout_s"),
    ],
)
def test_bad_workloads_name_the_key(overrides, path, says):
    with pytest.raises(ConfigError) as e:
        load_config(compose(["conf=local_cpu", *overrides]))
    assert str(e.value).startswith(path + ":") and says in str(e.value), str(e.value)


def test_bad_workload_exits_2_with_one_line(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "autotune.cli", "run", "--dry-run", "conf=serving_cpu",
                        "workload.slo.error_rate=2"], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert "workload.slo.error_rate" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "studies").exists()
