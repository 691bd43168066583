"""Dataclass schemas checked against plain YAML data: the one checker of every config section.

``build_section(cls, data, path)`` builds the frozen dataclass ``cls`` from a mapping;
an unknown key, a wrong type or a missing required field raises a one-line
:class:`~autotune.errors.ConfigError` naming ``path.key``, with "did you mean" for names.
:mod:`autotune.config.schema` checks its sections with it, and each engine its ``settings``
(``Engine.settings_schema``). A leaf module: it imports only :mod:`autotune.errors`.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

from autotune.errors import ConfigError
from autotune.errors import unknown_name

__all__ = ["build_section", "check_type"]


def check_type(path: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against a simple annotation; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return check_type(path, value, inner[0])
    if dataclasses.is_dataclass(tp):
        return build_section(tp, value, path)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, value, "expected a list")
        return tuple(check_type(f"{path}[{i}]", v, typing.get_args(tp)[0]) for i, v in enumerate(value))
    if origin is list or tp is list:
        if not isinstance(value, list):
            raise ConfigError(path, value, "expected a list")
        return value
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, value, "expected a mapping")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, value, "expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, value, "expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, value, "expected a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, value, "expected a string")
        return value
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints`` of a schema class, once per class (engines build theirs often)."""
    return typing.get_type_hints(cls)


def build_section(cls: type, data: Any, path: str):
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types raise ConfigError."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path, data, "expected a mapping")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise unknown_name(f"{path}.{key}", key, names, "key")
    kwargs = {k: check_type(f"{path}.{k}", v, hints[k]) for k, v in data.items()}
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{path}.{missing[0]}", None, f"required; give {', '.join(missing)}")
    return cls(**kwargs)
