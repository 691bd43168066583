"""The engine conformance suite: one set of tests that every engine must pass.

Like Optuna's ``StorageTestCase``: subclass :class:`EngineContract` in a test module, set the
class attributes that describe a small configuration of your engine, and pytest collects the
inherited ``test_*`` methods::

    class TestMyEngine(EngineContract):
        kind = "my_engine"
        settings = {"some_setting": 1}
        variants = {"m": {"path": "/models/m"}}
        params = {"threads": 2}                        # a configuration that runs here
        failures = [Failure({"threads": 0}, "infeasible", "threads=0")]

What it checks (docs/engines.md):

- the class side: the engine is registered under ``kind``; its settings pass
  ``validate_settings`` and an unknown or misspelt key is refused with "did you mean";
  ``check`` refuses undeclared knobs and passes the baseline; the pure hooks return their
  declared types (``resources``, ``full_params``, ``describe_launch``, ``predict``,
  ``max_concurrency``, ``export``);
- the lifecycle in this process: ``create -> start -> measure -> memory -> stop`` returns
  finite metrics with registered names (:mod:`objectives`), and nothing survives ``stop``:
  no child process and no listening port opened by one;
- through the real trial runner (a worker subprocess in its own process group): an ``ok``
  result whose metrics carry registered names, and every case in ``failures`` comes back
  as a result with its status and a reason, never as an exception.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import ClassVar

import pytest

from autotune.engines.base import Engine
from autotune.engines.base import Resources
from autotune.engines.predict import Prediction
from autotune.errors import ConfigError
from autotune.measure.spec import QualitySpec
from autotune.measure.spec import WorkloadSpec
from autotune.objectives import all_metrics
from autotune.registry import ENGINES
from autotune.registry import get_engine_class
from autotune.testing.procs import children_of
from autotune.testing.procs import listening_ports
from autotune.testing.procs import port_open
from autotune.testing.procs import wait_gone
from autotune.trial.runner import run_trial
from autotune.trial.spec import TrialResult
from autotune.trial.spec import TrialSpec

SMALL_WORKLOAD = WorkloadSpec(name="contract", prompts="short", max_tokens=8, warmup=0, repeats=2)


@dataclass(frozen=True)
class Failure:
    """A configuration that must fail, and how: status and a fragment of the reason."""

    params: dict[str, Any]
    status: str  # "failed" | "infeasible" | "timeout"
    reason: str
    settings: dict[str, Any] = field(default_factory=dict)  # merged over the class's settings
    timeout_s: float | None = None  # the trial's timeout (for "timeout" cases)


class EngineContract:
    """Inherit, set the class attributes, and pytest runs the contract over your engine."""

    kind: ClassVar[str] = ""
    settings: ClassVar[dict[str, Any]] = {}
    variants: ClassVar[dict[str, Any]] = {}
    params: ClassVar[dict[str, Any]] = {}  # a configuration that runs on this machine
    workload: ClassVar[WorkloadSpec] = SMALL_WORKLOAD
    failures: ClassVar[list[Failure]] = []
    timeout_s: ClassVar[float] = 120.0  # per trial through the runner

    # ---- helpers --------------------------------------------------------------------
    @property
    def cls(self) -> type[Engine]:
        return get_engine_class(self.kind)

    def spec(self, tmp_path: Path, params: dict, settings: dict | None = None,
             timeout_s: float | None = None, number: int = 0) -> TrialSpec:
        """A trial spec of this engine (quality off, the small workload)."""
        return TrialSpec(
            number=number, engine=self.kind, settings={**self.settings, **(settings or {})},
            variants=self.variants, params=params, workload=self.workload,
            quality=QualitySpec(enabled=False), timeout_s=timeout_s or self.timeout_s,
            workdir=str(tmp_path / f"trial{number}"),
        )

    @staticmethod
    def assert_registered_metrics(metrics: dict[str, float]) -> None:
        known = all_metrics()
        unknown = sorted(set(metrics) - set(known))
        assert not unknown, f"metrics without a registered name (objectives): {unknown}"

    # ---- the class side: pure hooks -------------------------------------------------
    def test_registered_under_its_kind(self) -> None:
        assert self.kind in ENGINES
        assert issubclass(self.cls, Engine)
        assert self.cls.name == self.kind

    def test_settings_are_accepted(self) -> None:
        self.cls.validate_settings(self.settings, self.variants, "engine")

    def test_unknown_setting_is_refused_with_did_you_mean(self) -> None:
        cls = self.cls
        with pytest.raises(ConfigError) as e:
            cls.validate_settings({**self.settings, "no_such_setting": 1}, self.variants)
        assert e.value.path == "engine.settings.no_such_setting"
        assert f"unknown setting of the {self.kind} engine" in str(e.value)
        name = max(cls.setting_names(), key=len)
        typo = name[:-1]
        if typo in cls.knobs_for(self.settings) or typo in cls.setting_names():
            return
        with pytest.raises(ConfigError, match=f"Did you mean: {name}"):
            cls.validate_settings({**self.settings, typo: 1}, self.variants)

    def test_settings_schema_is_a_frozen_dataclass(self) -> None:
        schema = self.cls.settings_schema
        assert dataclasses.is_dataclass(schema)
        assert schema.__dataclass_params__.frozen
        assert {"gpus", "memory_bandwidth_gbps"} <= set(self.cls.setting_names())

    def test_check_refuses_undeclared_knobs_and_passes_the_baseline(self) -> None:
        cls = self.cls
        reasons = cls.check({"no_such_knob": 1}, self.settings)
        assert any("no_such_knob is not a knob" in r for r in reasons), reasons
        assert cls.check(self.params, self.settings) == []
        baseline = cls.default_params(self.settings, self.variants)
        assert set(baseline) <= set(cls.knobs_for(self.settings)), "defaults of undeclared knobs"
        assert cls.check(baseline, self.settings) == []

    def test_pure_hooks_return_their_types(self, tmp_path: Path) -> None:
        cls = self.cls
        full = cls.full_params(self.params, self.settings, self.variants)
        assert {k: full[k] for k in self.params} == {k: v for k, v in self.params.items()}
        res = cls.resources(self.params, self.settings)
        assert isinstance(res, Resources) and res.num_cpus >= 0 and res.num_gpus >= 0
        assert isinstance(cls.describe_launch(self.params, self.settings, self.variants,
                                              self.workload.to_dict()), str)
        assert isinstance(cls.predict(self.params, self.settings, self.variants), Prediction)
        assert cls.max_concurrency is None or cls.max_concurrency >= 1
        assert isinstance(cls.own_timeout_s(self.settings), (int, float, type(None)))
        files = cls.export(full, self.settings, self.variants, tmp_path)
        assert all(Path(f).is_file() for f in files)
        assert isinstance(cls.export_warnings(full, self.settings), list)

    # ---- the lifecycle, in this process ---------------------------------------------
    def test_lifecycle_leaves_nothing_behind(self, tmp_path: Path) -> None:
        before = set(children_of(os.getpid()))
        engine = self.cls(self.settings, self.variants, self.params, tmp_path / "trial")
        try:
            engine.start()
            metrics, raw = engine.measure(self.workload)
            metrics |= engine.memory()
            spawned = [p for p in children_of(os.getpid()) if p not in before]
            ports = listening_ports([pid for pid, _ in spawned])
        finally:
            engine.stop()
        assert metrics and all(isinstance(v, float) and math.isfinite(v) for v in metrics.values()), metrics
        assert isinstance(raw, dict)
        self.assert_registered_metrics(metrics)
        assert wait_gone(spawned, timeout_s=15) == [], f"processes left after stop: {spawned}"
        time.sleep(0.1)
        assert [p for p in ports if port_open(p)] == [], f"ports still open after stop: {ports}"
        engine.stop()  # stop twice is safe

    # ---- through the real trial runner ----------------------------------------------
    def test_trial_through_the_runner(self, tmp_path: Path) -> None:
        result = run_trial(self.spec(tmp_path, self.params))
        assert isinstance(result, TrialResult)
        assert result.status == "ok", f"{result.reason}\n{result.log_tail}"
        assert result.metrics.get("load_s", -1) >= 0
        self.assert_registered_metrics(result.metrics)
        self.check_trial(result)

    def check_trial(self, result: TrialResult) -> None:
        """An engine's own checks of a real trial's result (its subclass may add them)."""

    def test_failures_come_back_as_results_with_a_reason(self, tmp_path: Path) -> None:
        if not self.failures:
            pytest.skip(f"no failure cases declared for {self.kind}")
        for i, case in enumerate(self.failures, start=1):
            spec = self.spec(tmp_path, {**self.params, **case.params}, case.settings,
                             case.timeout_s, number=i)
            result = run_trial(spec)
            assert result.status == case.status, (case, result.reason, result.log_tail)
            assert result.reason and case.reason in result.reason, (case, result.reason)
