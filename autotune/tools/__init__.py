"""Command-line helpers that are not part of a study (e.g. making a tiny test model)."""

from __future__ import annotations
