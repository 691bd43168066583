"""Our copy of TabbyAPI's config model (exl2-checkpoint ``common/config_models.py``) accepts
TabbyAPI's own sample config and refuses what TabbyAPI's pydantic checks refuse."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotune.engines.tabbyapi.schema_exl2 import validate

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "tabbyapi_config_sample.exl2-checkpoint.yml"


def test_tabbyapi_sample_config_is_valid() -> None:
    assert validate(yaml.safe_load(SAMPLE.read_text())) == []


@pytest.mark.parametrize(("config", "where"), [
    ({"model": {"cache_mode": "Q5"}}, "model.cache_mode"),
    ({"model": {"cache_mode": "8,9"}}, "model.cache_mode"),
    ({"model": {"cache_size": 1000}}, "model.cache_size"),
    ({"model": {"cache_size": 0}}, "model.cache_size"),
    ({"model": {"max_seq_len": -2}}, "model.max_seq_len"),
    ({"model": {"chunk_size": 0}}, "model.chunk_size"),
    ({"model": {"max_batch_size": 0}}, "model.max_batch_size"),
    ({"model": {"gpu_split": "30,20"}}, "model.gpu_split"),
    ({"draft_model": {"draft_cache_mode": "8,8"}}, "draft_model.draft_cache_mode"),
    ({"network": {"api_servers": ["OAI", "grpc"]}}, "network.api_servers"),
    ({"lora": {"loras": [{"name": "a", "scaling": -1}]}}, "lora.loras.0.scaling"),
    ({"model": {"cache_modes": "Q4"}}, "model.cache_modes"),  # TabbyAPI would silently ignore it
    ({"model": {"max_seq_len": 8192, "cache_size": 4096}}, "model.cache_size"),
    ({"model": {"chunk_size": 1000}}, "model.chunk_size"),
])
def test_refused_like_tabbyapi(config: dict, where: str) -> None:
    problems = validate(config)
    assert any(p.startswith(where) for p in problems), problems


def test_none_values_keep_defaults_as_in_tabbyapi() -> None:
    assert validate({"model": {"max_batch_size": None, "cache_mode": "Q4", "cache_size": 8192,
                               "max_seq_len": 8192, "gpu_split": [30.0, 20.5]},
                     "network": {"api_servers": ["OAI"]}}) == []


# ---- TabbyAPI main (exllamav3) ------------------------------------------------------------------
MAIN_SAMPLE = SAMPLE.parent / "tabbyapi_config_sample.main.yml"


def test_tabbyapi_main_sample_config_is_valid_for_main() -> None:
    from autotune.engines.tabbyapi import schema_main

    assert schema_main.validate(yaml.safe_load(MAIN_SAMPLE.read_text())) == []


def test_main_sample_has_keys_exl2_checkpoint_lacks() -> None:
    """The branches differ: main adds sse_ping_interval, cpu_moe_offload_layers, dynamic_draft..."""
    main_on_exl2 = validate(yaml.safe_load(MAIN_SAMPLE.read_text()))
    assert any(p.startswith("network.sse_ping_interval") for p in main_on_exl2), main_on_exl2


@pytest.mark.parametrize(("config", "where"), [
    ({"model": {"backend": "exllamav2"}}, "model.backend"),
    ({"model": {"cache_mode": "9,9"}}, "model.cache_mode"),
    ({"model": {"cpu_moe_offload_layers": "all"}}, "model.cpu_moe_offload_layers"),
    ({"network": {"sse_ping_interval": -1}}, "network.sse_ping_interval"),
    ({"draft_model": {"draft_mode": "eagle"}}, "draft_model.draft_mode"),
    ({"draft_model": {"draft_cache_mode": "8,8"}}, "draft_model.draft_cache_mode"),
    ({"model": {"reasoning_suppress_header": "x"}}, "model.reasoning_suppress_header"),
])
def test_main_refuses_like_tabbyapi_main(config: dict, where: str) -> None:
    from autotune.engines.tabbyapi import schema_main

    problems = schema_main.validate(config)
    assert any(p.startswith(where) for p in problems), problems
