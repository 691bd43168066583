"""Where a study's wall-clock goes: named spans of the driver's time, summed.

The driver times its loop and, inside it, the waits for trials; what is left is its own
time (asking the sampler, building the pool, predicting, telling, logging), printed at the
end of every run as "search overhead N s of M s".
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class Clock:
    """Sums of named spans of monotonic time (not thread-safe: the driver's thread only)."""

    def __init__(self) -> None:
        self.total: defaultdict[str, float] = defaultdict(float)

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Add the time spent in the ``with`` block to ``total[name]`` (also on an exception)."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.total[name] += time.monotonic() - t0

    def overhead_s(self) -> float:
        """The loop's time less its waits for trials: the driver's own time."""
        return max(0.0, self.total["loop"] - self.total["wait"])
