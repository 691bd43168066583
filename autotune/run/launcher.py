"""Launch trials: build a spec, reserve its resources, run it on the placement.

One :class:`Launcher` serves the search loop (``submit``, asynchronous), the quality
reference and the end-of-study re-measurement (``run_now``), so neither of them needs
the driver. It holds no Optuna or MLflow state.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from autotune.measure.spec import QualitySpec
from autotune.measure.spec import StopRule
from autotune.trial.spec import TrialResult
from autotune.trial.spec import TrialSpec

if TYPE_CHECKING:
    from autotune.config.schema import Config
    from autotune.engines.base import Engine
    from autotune.engines.base import Resources
    from autotune.run.placement import Placement


class Launcher:
    """Specs and placement for one study. Driver-thread only; not picklable."""

    def __init__(self, cfg: Config, engine: type[Engine], placement: Placement) -> None:
        self.cfg = cfg
        self.engine = engine
        self.placement = placement
        self.dir = Path(cfg.study.dir)
        self.quality = QualitySpec(enabled=cfg.quality.enabled, text=cfg.quality.text,
                                   n_tokens=cfg.quality.n_tokens, kld=cfg.quality.kld)

    def set_reference(self, reference_dir: str) -> None:
        """Where trials find the quality reference (measured once per study)."""
        self.quality = replace(self.quality, reference_dir=reference_dir)

    def workdir(self, number: int, tag: str = "trials") -> Path:
        """Where trial ``number`` writes its spec, result and log."""
        return (self.dir / tag / f"{number:04d}").resolve()

    def spec(self, number: int, params: dict[str, Any], mode: str = "trial", quality: bool = True,
             tag: str = "trials", early_stop: StopRule | None = None) -> TrialSpec:
        """The JSON record a worker runs for ``params``."""
        cfg = self.cfg
        return TrialSpec(
            number=number, engine=cfg.engine.kind, settings=cfg.engine.settings,
            variants=cfg.engine.variants, params=params, workload=cfg.workload,
            quality=replace(self.quality, enabled=self.quality.enabled and quality),
            timeout_s=cfg.study.trial_timeout_s, workdir=str(self.workdir(number, tag)), mode=mode,
            early_stop=early_stop,
        )

    def resources(self, params: dict[str, Any]) -> Resources:
        """What a trial with ``params`` reserves on Ray (CPUs, GPUs, custom)."""
        return self.engine.resources(params, self.cfg.engine.settings)

    def unschedulable(self, params: dict[str, Any]) -> str:
        """'' if the cluster could ever hold the trial, else why it never can."""
        return self.placement.fits(self.resources(params))

    def submit(self, number: int, params: dict[str, Any], quality: bool = True,
               early_stop: StopRule | None = None):
        """Start a search trial (``quality``: measure it; ``early_stop``: when it may stop as soon
        as it cannot win); returns the placement's handle."""
        spec = self.spec(number, params, quality=quality, early_stop=early_stop)
        return self.placement.submit(spec, self.resources(params))

    def run_now(self, number: int, params: dict[str, Any], mode: str = "trial", quality: bool = True,
                tag: str = "trials") -> TrialResult:
        """Run one trial and wait for it (quality reference, re-measurement)."""
        spec = self.spec(number, params, mode=mode, quality=quality, tag=tag)
        return self.placement.run_now(spec, self.resources(params))
