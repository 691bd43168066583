"""TabbyAPI's config model on its ``exl2-checkpoint`` branch (the ExLlamaV2 backend).

Reproduced from theroyallab/tabbyAPI ``common/config_models.py`` at commit 79126f90 (branch
exl2-checkpoint, the last branch that drives exllamav2) to validate the ``tabbyapi.yml`` of
the ``exllamav2`` engine; :mod:`autotune.engines.tabbyapi.schema_main` is the main branch's.
TabbyAPI validates ``config.yml`` with the pydantic models of its ``common/config_models.py``
after dropping keys whose value is None (``common/tabby_config.py``: ``filter_none_values``
then ``TabbyConfigModel.model_validate``). This module reproduces those models' types and
checks (cache modes, ``max_seq_len >= -1``, ``cache_size`` a positive multiple of 256,
``chunk_size > 0``, ``max_batch_size >= 1``, draft cache modes, LoRA scaling ``>= 0``...) so
an export is checked without installing TabbyAPI. One deliberate difference: unknown keys are
refused (``extra="forbid"``), where TabbyAPI silently ignores them, because a misspelt key in
an export would silently fall back to TabbyAPI's default.

The exllamav2 backend adds two load-time rules that are not in the pydantic model; they are
checked by :func:`validate` too: ``cache_size >= max_seq_len`` (else TabbyAPI truncates
max_seq_len) and ``chunk_size`` a multiple of 256 (else TabbyAPI rounds it up).
"""

from __future__ import annotations

from typing import Any
from typing import Literal
from typing import Union

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import ValidationError
from pydantic import constr
from pydantic import field_validator

CACHE_SIZES = Literal["FP16", "Q8", "Q6", "Q4"]
CACHE_TYPE = Union[CACHE_SIZES, constr(pattern=r"^[2-8]\s*,\s*[2-8]$")]  # noqa: UP007


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class ConfigOverrideConfig(_Section):
    config: str | None = None  # path of an overriding config.yml (``--config``)


class NetworkConfig(_Section):
    host: str | None = "127.0.0.1"
    port: int | None = 5000
    disable_auth: bool | None = False
    disable_fetch_requests: bool | None = False
    send_tracebacks: bool | None = False
    api_servers: list[Literal["oai", "kobold"]] | None = ["oai"]

    @field_validator("api_servers", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return [s.lower() for s in v] if isinstance(v, list) else v


class LoggingConfig(_Section):
    log_prompt: bool | None = False
    log_generation_params: bool | None = False
    log_requests: bool | None = False
    log_chat_completion_requests: bool | None = False


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
    rope_scale: float | None = 1.0
    rope_alpha: float | Literal["auto"] | None = None
    chunk_size: int | None = Field(2048, gt=0)
    output_chunking: bool | None = True
    max_batch_size: int | None = Field(None, ge=1)
    prompt_template: str | None = None
    vision: bool | None = False
    force_enable_thinking: bool = False
    reasoning: bool = False
    reasoning_start_token: str = "<think>"
    reasoning_end_token: str = "</think>"
    reasoning_suppress_header: str | None = None
    tool_format: str | None = None


class DraftModelConfig(_Section):
    draft_mode: Literal["model", "disabled", "mtp", "ngram"] | None = "model"
    draft_model_dir: str | None = "models"
    draft_model_name: str | None = None
    draft_rope_scale: float | None = 1.0
    draft_rope_alpha: float | None = None
    draft_cache_mode: CACHE_SIZES | None = "FP16"
    draft_gpu_split: list[float] = Field(default_factory=list)
    draft_num_tokens: int | None = None
    ngram_match_min: int | None = 2


class SamplingConfig(_Section):
    override_preset: str | None = None


class LoraInstanceModel(_Section):
    name: str | None = None
    scaling: float = Field(1.0, ge=0)


class LoraConfig(_Section):
    lora_dir: str | None = "loras"
    loras: list[LoraInstanceModel] | None = None


class EmbeddingsConfig(_Section):
    embedding_model_dir: str | None = "models"
    embeddings_device: Literal["cpu", "auto", "cuda"] | None = "cpu"
    embedding_model_name: str | None = None


class MemoryConfig(_Section):
    sysmem_recurrent_cache: int | None = 4096
    cuda_malloc_async: bool | None = True


class DeveloperConfig(_Section):
    unsafe_launch: bool | None = False
    disable_request_streaming: bool | None = False
    realtime_process_priority: bool | None = False
    seqlog: bool | None = False
    seqlog_server_url: str | None = "http://localhost:5341"
    seqlog_api_key: str | None = None


class TabbyConfigModel(_Section):
    """The whole ``config.yml``."""

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


def _drop_none(value: Any) -> Any:
    """TabbyAPI's ``filter_none_values``: unset (None) keys keep their defaults."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    return value


def validate(config: dict) -> list[str]:
    """Problems TabbyAPI would raise (or silently fix) loading ``config``; [] if none."""
    try:
        model = TabbyConfigModel.model_validate(_drop_none(config))
    except ValidationError as e:
        return [f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()]
    out = []
    m = model.model
    if m is not None and m.cache_size is not None and m.max_seq_len not in (None, -1) \
            and m.cache_size < m.max_seq_len:
        out.append(f"model.cache_size: {m.cache_size} < max_seq_len {m.max_seq_len}; "
                   "TabbyAPI would cut max_seq_len to the cache size")
    if m is not None and m.chunk_size is not None and m.chunk_size % 256:
        out.append(f"model.chunk_size: {m.chunk_size} is not a multiple of 256; TabbyAPI rounds it up")
    return out
