"""A :class:`Knob`: one parameter an engine accepts (type, allowed values, the engine's spelling),
declared in code by each engine or in YAML for a ``command`` engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from autotune.errors import ConfigError
from autotune.errors import unknown_name

KNOB_TYPES = ("int", "float", "bool", "str", "list")  # the types a YAML-declared knob may have
KNOB_KEYS = ("type", "choices", "low", "high", "doc", "spelling")


@dataclass(frozen=True)
class Knob:
    """A parameter an engine accepts: its type, allowed values and the engine's spelling."""

    type: str  # "int" | "float" | "bool" | "str" | "list" | "str|list"
    choices: tuple | None = None
    low: float | None = None
    high: float | None = None
    spelling: str = ""
    doc: str = ""
    pattern: str = ""  # a str knob's values must match this regex whole; ``doc`` says it in words

    def allowed(self) -> str:
        if self.pattern:
            return self.doc or f"a string matching {self.pattern}"
        if self.choices is not None:
            return "one of " + ", ".join(map(str, self.choices))
        if self.type in ("int", "float"):
            lo = "-inf" if self.low is None else f"{self.low:g}"
            hi = "inf" if self.high is None else f"{self.high:g}"
            return f"a{'n' if self.type == 'int' else ''} {self.type} in [{lo}, {hi}]"
        return f"a {self.type}"

    def accepts(self, value: Any) -> bool:
        if self.type == "bool":
            ok = isinstance(value, bool)
        elif self.type == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif self.type == "float":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif self.type == "list":
            ok = isinstance(value, (list, tuple))
        elif self.type == "str|list":
            ok = isinstance(value, (str, list, tuple))
        else:
            ok = isinstance(value, str)
        if not ok:
            return False
        if self.choices is not None and value not in self.choices:
            return False
        if self.pattern and not re.fullmatch(self.pattern, value):
            return False
        if self.type in ("int", "float"):
            if self.low is not None and value < self.low:
                return False
            if self.high is not None and value > self.high:
                return False
        return True

    @classmethod
    def parse(cls, name: str, spec: Any, path: str, default_type: str | None = None) -> Knob:
        """A knob declared in YAML (``{type, choices, low, high, doc, spelling}``).

        Used by the engines whose knobs are declared in their settings (``command``,
        ``openai_server``); ``default_type`` is the type when ``type`` is left out.
        """
        if not isinstance(spec, dict):
            raise ConfigError(path, spec, "expected {type: int|float|bool|str|list, choices, ...}")
        for key in spec:
            if key not in KNOB_KEYS:
                raise unknown_name(f"{path}.{key}", key, KNOB_KEYS, "knob key")
        kind = spec.get("type", default_type)
        if kind not in KNOB_TYPES:
            raise unknown_name(f"{path}.type", kind, KNOB_TYPES, "knob type")
        choices = spec.get("choices")
        if choices is not None and (not isinstance(choices, list) or not choices):
            raise ConfigError(f"{path}.choices", choices, "expected a non-empty list")
        for key in ("low", "high"):
            v = spec.get(key)
            if v is not None and (kind not in ("int", "float") or not _is_number(v)):
                raise ConfigError(f"{path}.{key}", v, "low/high are numbers, for int and float knobs")
        for i, c in enumerate(choices or []):
            if not cls(kind).accepts(c):
                raise ConfigError(f"{path}.choices[{i}]", c, f"a {kind} knob's choices are {kind}s")
        return cls(kind, tuple(choices) if choices else None, spec.get("low"), spec.get("high"),
                   spelling=str(spec.get("spelling", name)), doc=str(spec.get("doc", "")))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
