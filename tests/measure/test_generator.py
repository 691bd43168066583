"""Every registered engine is a ``Generator``: the members measure/ uses, and its context."""

from __future__ import annotations

import pytest

from autotune.engines.base import Engine
from autotune.errors import ConfigError
from autotune.measure.types import Generator
from autotune.registry import ENGINES
from autotune.registry import get_engine_class

MEMBERS = sorted({n for n in vars(Generator) if not n.startswith("_")}
                 | set(Generator.__annotations__))


def test_the_protocol_names_what_measure_uses():
    assert MEMBERS == ["context_tokens", "generate", "logprobs", "max_concurrency", "memory",
                       "name"]


@pytest.mark.parametrize("kind", sorted(ENGINES))
def test_every_engine_has_the_generator_members(kind, tmp_path):
    cls = get_engine_class(kind)
    engine = cls({}, {}, {}, tmp_path)  # pure: nothing is loaded before start()
    missing = [m for m in MEMBERS if not hasattr(engine, m)]
    assert missing == []
    knob = cls.context_knob_for({})
    assert knob is None or knob in cls.knobs_for({}), f"{kind}: context_knob {knob} is not a knob"


@pytest.mark.parametrize(("kind", "knob"), [("llamacpp", "n_ctx"), ("exllamav2", "max_seq_len"),
                                            ("vllm", "max_model_len"), ("fake", None),
                                            ("command", None), ("openai_server", None)])
def test_context_knob_of_each_engine(kind, knob):
    assert get_engine_class(kind).context_knob_for({}) == knob


def test_context_tokens_reads_the_knob_from_params_then_settings(tmp_path):
    cls = get_engine_class("llamacpp")
    assert cls({}, {}, {"n_ctx": 1024}, tmp_path).context_tokens() == 1024
    assert cls({"n_ctx": 2048}, {}, {}, tmp_path).context_tokens() == 2048
    assert cls({"n_ctx": 2048}, {}, {"n_ctx": 512}, tmp_path).context_tokens() == 512
    assert cls({}, {}, {"n_ctx": 0}, tmp_path).context_tokens() is None  # 0: the model's own
    assert cls({}, {}, {"max_model_len": 512}, tmp_path).context_tokens() is None  # not its knob
    assert Engine({}, {}, {"n_ctx": 512}, tmp_path).context_tokens() is None  # no context knob


def test_a_template_server_names_its_context_knob_in_settings(tmp_path):
    cls = get_engine_class("openai_server")
    settings = {"argv": ["srv", "--ctx", "{n_ctx}"], "context_knob": "n_ctx",
                "knobs": {"n_ctx": {"type": "int", "low": 0, "high": 65536}}}
    cls.validate_settings(settings, {})
    assert cls.context_knob_for(settings) == "n_ctx"
    assert cls(settings, {}, {"n_ctx": 4096}, tmp_path).context_tokens() == 4096
    with pytest.raises(ConfigError, match="context_knob"):
        cls.validate_settings({**settings, "context_knob": "n_cx"}, {})
