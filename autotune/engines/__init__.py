"""Engine adapters behind one contract; see :mod:`autotune.engines.base`."""

from __future__ import annotations

from autotune.engines.base import ENGINES
from autotune.engines.base import Engine
from autotune.engines.base import Generation
from autotune.engines.base import Knob
from autotune.engines.base import Resources
from autotune.engines.base import get_engine_class

__all__ = ["ENGINES", "Engine", "Generation", "Knob", "Resources", "get_engine_class"]
