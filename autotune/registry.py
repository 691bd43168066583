"""The engine registry: each engine's name and the ``module:Class`` that implements it.

Importing autotune never imports an engine's library: an engine's module is imported only when
:func:`get_engine_class` is asked for it, in the process that runs it. The registry sits at the
bottom of the package so that the trial worker, the one place engines are loaded, imports no
stage above it; :mod:`autotune.engines.base` re-exports both names for the stages above.
"""

from __future__ import annotations

import importlib

from autotune.errors import ConfigError
from autotune.errors import unknown_name

# name -> "module:Class"; importing autotune never imports an engine's library.
ENGINES: dict[str, str] = {
    "llamacpp": "autotune.engines.llamacpp.engine:LlamaCppEngine",
    "command": "autotune.engines.command:CommandEngine",
    "fake": "autotune.engines.fake:FakeEngine",
    "exllamav2": "autotune.engines.exllamav2.engine:ExLlamaV2Engine",
    "exllamav3": "autotune.engines.exllamav3.engine:ExLlamaV3Engine",
    "tabbyapi": "autotune.engines.tabbyapi.engine:TabbyAPIEngine",
    "vllm": "autotune.engines.vllm.engine:VLLMEngine",
    "openai_server": "autotune.engines.openai_server:OpenAIServerEngine",
    "llama_server": "autotune.engines.llama_server.engine:LlamaServerEngine",
}


def get_engine_class(kind: str, path: str = "engine.kind") -> type:
    """Import an engine class (an :class:`autotune.engines.base.Engine`) by registry name: only
    its module, not its library."""
    target = ENGINES.get(kind)
    if target is None:
        raise unknown_name(path, kind, ENGINES, "engine")
    module, _, cls = target.partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as e:
        raise ConfigError(path, kind, f"engine module {module} cannot be imported: {e}") from e
