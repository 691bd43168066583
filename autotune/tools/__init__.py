"""Command-line helpers that are not part of a study: a tiny test model, the prompt sets."""

from __future__ import annotations
