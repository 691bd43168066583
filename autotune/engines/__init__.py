"""Engine adapters behind one contract; see :mod:`autotune.engines.base` and docs/engines.md."""

from __future__ import annotations

from autotune.engines.base import Engine
from autotune.engines.base import EngineSettings
from autotune.engines.base import Knob
from autotune.engines.base import Resources
from autotune.measure.types import Generation
from autotune.registry import ENGINES
from autotune.registry import get_engine_class

__all__ = ["ENGINES", "Engine", "EngineSettings", "Generation", "Knob", "Resources",
           "get_engine_class"]
