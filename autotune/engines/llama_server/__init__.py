"""The real ``llama-server`` as an engine: the build/lookup of the binary (``build``), its
flags and defaults (``knobs``), the engine (``engine``) and its pre-launch estimate (``predict``).
"""
