"""autotune: find the fastest LLM-engine configuration that meets your constraints.

config -> search space -> ask -> trial subprocess -> metrics -> tell + log -> Pareto / export.
"""

from __future__ import annotations

__version__ = "0.1.0"
