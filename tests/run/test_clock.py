"""The driver's clock (search overhead) and the console's slow-step notes (issue 43)."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from autotune.config.compose import compose
from autotune.config.schema import load_config
from autotune.output.report import Reporter
from autotune.run.clock import Clock


def test_overhead_is_the_loop_less_its_waits_for_trials():
    clock = Clock()
    with clock.span("loop"):
        time.sleep(0.05)  # the driver's own work
        with clock.span("wait"):
            time.sleep(0.2)  # a trial running
    assert clock.total["loop"] >= 0.25 and clock.total["wait"] >= 0.2
    assert 0.04 <= clock.overhead_s() < clock.total["loop"] - 0.19
    with pytest.raises(RuntimeError), clock.span("wait"):  # an exception still counts its time
        raise RuntimeError
    assert clock.overhead_s() >= 0.0


def test_a_slow_step_says_what_it_is_doing_and_a_quick_one_says_nothing():
    out = io.StringIO()
    report = Reporter(load_config(compose(["conf=local_cpu"])), Console(file=out, width=200))
    with report.slow_step("quick", after_s=5.0):
        pass
    with report.slow_step("asking", after_s=0.05), report.slow_step("building the pool", after_s=0.05):
        time.sleep(0.3)
    lines = out.getvalue().splitlines()
    assert lines[0] == "building the pool ..." and lines[1].startswith("building the pool: done in 0.")
    assert len(lines) == 2, lines  # neither the quick step nor the outer one spoke
