"""The default sampler ``auto``: bo for a single-objective search, GP for a Pareto search."""

from __future__ import annotations

import optuna

from autotune.config.schema import StudyConfig
from autotune.search.bo import PoolSampler
from autotune.search.samplers import make_sampler
from autotune.search.samplers import resolve
from autotune.search.samplers import torch_available
from autotune.search.samplers import uses_design


def test_auto_is_the_default_and_uses_the_design():
    assert StudyConfig().sampler == "auto"
    assert uses_design("auto") and uses_design("bo")
    assert not uses_design("random") and not uses_design("grid")


def test_named_samplers_are_kept_as_named():
    for name in ("bo", "tpe", "gp", "nsga2", "random", "grid"):
        assert resolve(name, "single") == name
        assert resolve(name, "pareto") == name


def test_auto_is_bo_up_to_two_objectives_and_gp_beyond():
    assert resolve("auto", "single") == "bo"
    assert resolve("auto", "pareto", 2) == "bo"  # tests/search/test_pareto.py
    assert resolve("auto", "pareto", 3) == ("gp" if torch_available() else "tpe")
    assert isinstance(make_sampler("auto", 0, None, 30, 8), PoolSampler)
    assert isinstance(make_sampler("auto", 0, None, 30, 8, "pareto", objectives=["a", "b"]), PoolSampler)
    beyond = optuna.samplers.GPSampler if torch_available() else optuna.samplers.TPESampler
    assert isinstance(make_sampler("auto", 0, None, 30, 8, "pareto", objectives=["a", "b", "c"]), beyond)
