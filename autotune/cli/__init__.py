"""The command line: ``autotune run`` (main.py) and the verbs on a study that exists (commands.py)."""

from __future__ import annotations
