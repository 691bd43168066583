"""The default sampler ``auto``: bo for a single-objective search, GP for a Pareto search."""

from __future__ import annotations

import optuna
import pytest

from autotune.config.schema import StudyConfig
from autotune.errors import ConfigError
from autotune.search.bo import PoolSampler
from autotune.search.samplers import make_sampler
from autotune.search.samplers import resolve
from autotune.search.samplers import torch_available
from autotune.search.samplers import uses_design
from autotune.search.samplers import validate_sampler


def test_auto_is_the_default_and_uses_the_design():
    assert StudyConfig().sampler == "auto"
    assert uses_design("auto") and uses_design("bo")
    assert not uses_design("random") and not uses_design("grid")


def test_named_samplers_are_kept_as_named():
    for name in ("bo", "tpe", "gp", "nsga2", "random", "grid"):
        assert resolve(name, "single") == name
        assert resolve(name, "pareto") == name


def test_auto_is_bo_for_a_single_search_and_gp_for_a_pareto_search():
    assert resolve("auto", "single") == "bo"
    assert resolve("auto", "pareto") == ("gp" if torch_available() else "tpe")  # tests/search/test_pareto.py
    assert isinstance(make_sampler("auto", 0, None, 30, 8), PoolSampler)
    pareto = optuna.samplers.GPSampler if torch_available() else optuna.samplers.TPESampler
    assert isinstance(make_sampler("auto", 0, None, 30, 8, "pareto"), pareto)


def test_bo_refuses_a_pareto_search_with_one_line():
    with pytest.raises(ConfigError, match="bo searches one objective") as e:
        validate_sampler("bo", None, "pareto")
    assert e.value.path == "study.sampler" and "\n" not in str(e.value)
