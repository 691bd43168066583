"""Test helpers shipped with autotune: the engine conformance suite and process checks.

``autotune.testing.engine_contract.EngineContract`` is what a new engine's tests inherit
(docs/engines.md); it needs pytest, which is why nothing at runtime imports this package.
"""
