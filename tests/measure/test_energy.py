"""Energy per token: the meter's idle subtraction, RAPL's counter files, and the trial worker.

RAPL is not readable on the machine these tests were written on (no /sys/class/powercap),
and it has no GPU: the counters here are fakes, named as such (a fake clock-driven counter,
and a fake powercap tree read by the real :class:`RaplCounter`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.measure import energy
from autotune.measure.energy import EnergyMeter
from autotune.measure.energy import energy_metrics
from autotune.measure.energy import find_counters
from autotune.measure.energy import measured_tokens
from autotune.measure.energy import rapl_counters
from autotune.measure.spec import QualitySpec
from autotune.measure.spec import WorkloadSpec
from autotune.trial import worker
from autotune.trial.spec import TrialSpec


class FakeClock:
    """A clock that only moves when the meter sleeps or the test advances it."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class FakePowerCounter:
    """A fake energy counter: ``watts`` (a function of the fake clock) integrated exactly."""

    def __init__(self, clock: FakeClock, idle_w: float, busy_w: float, busy_from: float) -> None:
        self.name, self.clock = "fake counter", clock
        self.idle_w, self.busy_w, self.busy_from = idle_w, busy_w, busy_from

    def read_j(self) -> float:
        t = self.clock()
        busy = max(0.0, t - self.busy_from)
        return self.idle_w * (t - busy) + self.busy_w * busy


def test_the_meter_subtracts_the_idle_power_it_measured_first():
    clock = FakeClock()
    counters = [FakePowerCounter(clock, 10.0, 30.0, busy_from=1.0),
                FakePowerCounter(clock, 5.0, 5.0, busy_from=1.0)]  # a device the trial left idle
    with EnergyMeter(counters, idle_s=1.0, clock=clock, sleep=clock.sleep) as meter:
        clock.t += 2.0  # the measurement: 2 s at 30 W on the first device
    assert meter.idle_w == [10.0, 5.0]
    assert meter.net_j == pytest.approx((30.0 - 10.0) * 2.0)
    assert energy_metrics(meter, 80) == {"energy_j_per_token": pytest.approx(0.5)}
    assert "fake counter + fake counter: whole devices, idle 15.0 W" in meter.describe()
    assert energy_metrics(EnergyMeter([]), 80) == {}


def _fake_powercap(root: Path, uj: int, wrap: int = 1000) -> Path:
    d = root / "intel-rapl:0"
    d.mkdir(parents=True)
    (d / "name").write_text("package-0\n")
    (d / "max_energy_range_uj").write_text(f"{wrap}\n")
    (d / "energy_uj").write_text(f"{uj}\n")
    (root / "intel-rapl:0:0").mkdir()  # a sub-domain (core): counted within its package
    return d


def test_rapl_counter_reads_a_fake_powercap_tree_and_unwraps(tmp_path):
    d = _fake_powercap(tmp_path, 900)
    counters, why = rapl_counters(tmp_path)
    assert why == "" and [c.name for c in counters] == ["RAPL package-0"]
    assert counters[0].read_j() == pytest.approx(900e-6)
    (d / "energy_uj").write_text("100\n")  # wrapped past max_energy_range_uj
    assert counters[0].read_j() == pytest.approx((100 + 1001) * 1e-6)


def test_no_counter_is_a_one_line_reason(tmp_path):
    counters, why = rapl_counters(tmp_path / "absent")
    assert counters == [] and "no package domain" in why
    unreadable = _fake_powercap(tmp_path / "ro", 1)
    (unreadable / "energy_uj").unlink()
    assert "RAPL unreadable" in rapl_counters(tmp_path / "ro")[1]
    if not Path("/sys/class/powercap").is_dir() and not energy.list_gpus():
        counters, why = find_counters()
        assert counters == [] and "\n" not in why
        assert why == ("no energy counter readable here: NVML: no GPU; RAPL: no package domain "
                       "under /sys/class/powercap")


def test_tokens_count_every_level_of_a_load_search_and_the_warm_up():
    assert measured_tokens({"output_tokens": [32, 32, 30]}, warmup_tokens=32) == 126
    search = [{"aggregate_tps": 100.0, "wall_s": 2.0}, {"aggregate_tps": 150.0, "wall_s": 1.0}]
    assert measured_tokens({"output_tokens": [32], "search": search}) == 350


def _spec(tmp_path: Path) -> TrialSpec:
    return TrialSpec(number=1, engine="fake", params={"x": 0.7, "y": 0.3, "gpus": 0, "duration_s": 0},
                     settings={}, variants={}, workload=WorkloadSpec(max_tokens=16, repeats=2),
                     quality=QualitySpec(enabled=False), workdir=str(tmp_path), timeout_s=60)


def test_the_worker_reports_energy_per_token_or_why_not(tmp_path, monkeypatch):
    counters, why = find_counters()  # this machine's real counters
    res = worker.execute(_spec(tmp_path))
    assert res.status == "ok", res.reason
    if not counters:
        assert "energy_j_per_token" not in res.metrics
        assert res.info["energy"] == why and why.startswith("no energy counter readable here: ")

    class Constant:  # a fake counter: 40 W whenever read (idle and busy alike: nothing above idle)
        name = "fake 40 W counter"

        def __init__(self) -> None:
            import time
            self.t0 = time.monotonic()

        def read_j(self) -> float:
            import time
            return 40.0 * (time.monotonic() - self.t0)

    monkeypatch.setattr(worker, "find_counters", lambda: ([Constant()], ""))
    res = worker.execute(_spec(tmp_path))
    assert res.status == "ok", res.reason
    # constant power: the energy above idle is ~0 J; the meter clips at 0 per device
    assert 0.0 <= res.metrics["energy_j_per_token"] < 0.5
    assert res.info["energy"].startswith("fake 40 W counter: whole devices, idle 40.0 W")


@pytest.mark.skipif(bool(find_counters()[0]), reason="this machine has an energy counter")
def test_an_energy_objective_without_a_counter_is_one_line_and_exit_2(cli, tmp_path):
    """Where no counter is readable, asking for energy_j_per_token stops before any trial."""
    from tests.conftest import study_overrides

    root = str(Path(__file__).resolve().parents[2])  # this checkout's autotune, not an installed one
    proc = cli("run", "conf=local_cpu", "objectives=[decode_tps,energy_j_per_token]",
               *study_overrides(tmp_path), timeout=300, env={"PYTHONPATH": root})
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(lines) == 1 and "objectives: got 'energy_j_per_token'; no energy counter" in lines[0]
    assert "Traceback" not in proc.stderr and not (tmp_path / "studies" / "e2e" / "optuna.db").exists()
