"""The default sampler ``auto``: GP for a single-objective search with torch, else TPE."""

from __future__ import annotations

import optuna
import pytest

from autotune.config import StudyConfig
from autotune.samplers import auto_note
from autotune.samplers import make_sampler
from autotune.samplers import resolve
from autotune.samplers import torch_available
from autotune.samplers import uses_design

HAS_TORCH = torch_available()


def test_auto_is_the_default_and_uses_the_design():
    assert StudyConfig().sampler == "auto"
    assert uses_design("auto")


def test_named_samplers_are_kept_as_named():
    for name in ("tpe", "gp", "nsga2", "random", "grid"):
        assert resolve(name, "single") == name
        assert resolve(name, "pareto") == name


def test_auto_is_tpe_for_a_pareto_search():
    assert resolve("auto", "pareto") == "tpe"
    assert auto_note("auto", "pareto") is None


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch for the GP sampler")
def test_auto_is_gp_when_torch_is_installed():
    assert resolve("auto", "single") == "gp"
    assert auto_note("auto", "single") is None
    assert isinstance(make_sampler("auto", 0, None, 30, 8), optuna.samplers.GPSampler)


def test_auto_falls_back_to_tpe_with_one_line_without_torch():
    assert resolve("auto", "single", has_torch=False) == "tpe"
    note = auto_note("auto", "single", has_torch=False)
    assert note is not None and "torch" in note and "\n" not in note
    assert isinstance(make_sampler("auto", 0, None, 30, 8, has_torch=False), optuna.samplers.TPESampler)
    assert auto_note("tpe", "single", has_torch=False) is None
