"""TabbyAPI's config model on its ``main`` branch (ExLlamaV3 only), to validate ``tabbyapi.yml``.

Reproduced from theroyallab/tabbyAPI ``common/config_models.py`` at commit e632af41 (branch
main, August 2026). Since July 2026 main drives exllamav3 only: ``common/model.py``'s
``validate_backend`` refuses ``backend: exllamav2`` and EXL2/GPTQ models. Against the
exl2-checkpoint model (:mod:`autotune.engines.tabbyapi.schema_exl2`) main adds
``network.sse_ping_interval``, ``model.cpu_moe_offload_layers``, ``template_vars_default`` /
``template_vars_force``, ``start_in_reasoning``, ``tool_calls_in_reasoning``,
``reasoning_budget_tokens`` / ``reasoning_budget_message``, ``harmony``, ``muse_glimmer``,
``draft_model.dynamic_draft`` and ``memory.sysmem_kv_cache``, and drops
``reasoning_suppress_header``. The sections that are the same on both branches are imported
from the exl2-checkpoint module.

As there, unknown keys are refused (TabbyAPI ignores them) and :func:`validate` adds the
exllamav3 backend's load-time rules (``backends/exllamav3/model.py``): the backend must be
exllamav3, ``max_seq_len`` is cut to ``cache_size``, ``chunk_size`` is rounded up to a
multiple of 256, and n-gram drafting needs ``ngram_match_min > 0``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic import ValidationError
from pydantic import field_validator

from autotune.engines.tabbyapi.schema_exl2 import CACHE_SIZES
from autotune.engines.tabbyapi.schema_exl2 import CACHE_TYPE
from autotune.engines.tabbyapi.schema_exl2 import ConfigOverrideConfig
from autotune.engines.tabbyapi.schema_exl2 import DeveloperConfig
from autotune.engines.tabbyapi.schema_exl2 import EmbeddingsConfig
from autotune.engines.tabbyapi.schema_exl2 import LoggingConfig
from autotune.engines.tabbyapi.schema_exl2 import LoraConfig
from autotune.engines.tabbyapi.schema_exl2 import SamplingConfig
from autotune.engines.tabbyapi.schema_exl2 import _drop_none
from autotune.engines.tabbyapi.schema_exl2 import _Section

BACKENDS = ("exllamav3",)


class NetworkConfig(_Section):
    host: str | None = "127.0.0.1"
    port: int | None = 5000
    disable_auth: bool | None = False
    disable_fetch_requests: bool | None = False
    send_tracebacks: bool | None = False
    api_servers: list[Literal["oai", "kobold"]] | None = ["oai"]
    sse_ping_interval: int | None = Field(15, ge=0)

    @field_validator("api_servers", mode="before")
    @classmethod
    def _lower(cls, v):
        return [s.lower() for s in v] if isinstance(v, list) else v


class ModelConfig(_Section):
    model_dir: str = "models"
    inline_model_loading: bool | None = False
    use_dummy_models: bool | None = False
    dummy_model_names: list[str] = ["gpt-3.5-turbo"]
    model_name: str | None = None
    use_as_default: list[str] = Field(default_factory=list)
    backend: str | None = None
    max_seq_len: int | None = Field(None, ge=-1)
    cache_size: int | None = Field(None, multiple_of=256, gt=0)
    cache_mode: CACHE_TYPE | None = "FP16"
    tensor_parallel: bool | None = False
    tensor_parallel_backend: str | None = "native"
    gpu_split_auto: bool | None = True
    autosplit_reserve: list[float] = [96]
    gpu_split: list[float] = Field(default_factory=list)
    cpu_moe_offload_layers: int | None = 0
    rope_scale: float | None = 1.0
    rope_alpha: float | Literal["auto"] | None = None
    chunk_size: int | None = Field(2048, gt=0)
    output_chunking: bool | None = True
    max_batch_size: int | None = Field(None, ge=1)
    prompt_template: str | None = None
    vision: bool | None = False
    template_vars_default: dict = Field(default_factory=dict)
    template_vars_force: dict = Field(default_factory=dict)
    force_enable_thinking: bool = False
    reasoning: bool = False
    reasoning_start_token: str = "<think>"
    reasoning_end_token: str = "</think>"
    start_in_reasoning: str = "auto"
    tool_calls_in_reasoning: bool = True
    reasoning_budget_tokens: int | None = None
    reasoning_budget_message: str | None = None
    tool_format: str | None = None
    harmony: bool | None = None
    muse_glimmer: bool | None = None


class DraftModelConfig(_Section):
    draft_mode: Literal["model", "disabled", "mtp", "ngram"] | None = "model"
    draft_model_dir: str | None = "models"
    draft_model_name: str | None = None
    draft_rope_scale: float | None = 1.0
    draft_rope_alpha: float | None = None
    draft_cache_mode: CACHE_SIZES | None = "FP16"
    draft_gpu_split: list[float] = Field(default_factory=list)
    draft_num_tokens: int | None = None
    dynamic_draft: bool | None = False
    ngram_match_min: int | None = 2


class MemoryConfig(_Section):
    sysmem_recurrent_cache: int | None = 4096
    sysmem_kv_cache: int | None = 0
    cuda_malloc_async: bool | None = True


class TabbyConfigModel(_Section):
    """The whole ``config.yml`` (main branch)."""

    config: ConfigOverrideConfig | None = None
    network: NetworkConfig | None = None
    logging: LoggingConfig | None = None
    model: ModelConfig | None = None
    draft_model: DraftModelConfig | None = None
    lora: LoraConfig | None = None
    embeddings: EmbeddingsConfig | None = None
    sampling: SamplingConfig | None = None
    memory: MemoryConfig | None = None
    developer: DeveloperConfig | None = None


def validate(config: dict) -> list[str]:
    """Problems TabbyAPI main would raise (or silently fix) loading ``config``; [] if none."""
    try:
        model = TabbyConfigModel.model_validate(_drop_none(config))
    except ValidationError as e:
        return [f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()]
    out = []
    m, d = model.model, model.draft_model
    if m is not None and m.backend is not None and m.backend not in BACKENDS:
        out.append(f"model.backend: {m.backend!r} is refused by TabbyAPI main (exllamav3 only; "
                   "ExLlamaV2 lives on the exl2-checkpoint branch)")
    if m is not None and m.cache_size is not None and m.max_seq_len not in (None, -1) \
            and m.cache_size < m.max_seq_len:
        out.append(f"model.cache_size: {m.cache_size} < max_seq_len {m.max_seq_len}; "
                   "TabbyAPI would cut max_seq_len to the cache size")
    if m is not None and m.chunk_size is not None and m.chunk_size % 256:
        out.append(f"model.chunk_size: {m.chunk_size} is not a multiple of 256; TabbyAPI rounds it up")
    if d is not None and d.draft_mode == "ngram" and (d.ngram_match_min or 0) <= 0:
        out.append("draft_model.ngram_match_min: must be greater than 0 for n-gram drafting")
    return out
