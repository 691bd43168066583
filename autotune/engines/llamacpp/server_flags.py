"""Check a ``llama-server`` command line against the flags of the llama.cpp that
llama-cpp-python ships.

``autotune/engines/llamacpp/llama_server_flags.json`` lists the flags ``llama-server`` accepts and the
values of its enumerated options (KV cache types, speculative types, on/off/auto), read
from llama-cpp-python's vendored llama.cpp sources by
:mod:`autotune.tools.llama_server_flags`. :func:`argv_reasons` returns the problems of an
argv (an empty list when llama-server would parse it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parent / "llama_server_flags.json"
# options whose value is one of a known set: flag spellings -> key of ``values``
ENUMS = {("-fa", "--flash-attn"): "on_off_auto", ("-ctk", "--cache-type-k"): "kv_cache_types",
         ("-ctv", "--cache-type-v"): "kv_cache_types", ("--spec-type",): "spec_types"}


@dataclass(frozen=True)
class ServerFlags:
    """The flags of one llama.cpp version's ``llama-server``."""

    llama_cpp_python: str
    llama_cpp_commit: str
    flags: frozenset[str]
    takes_value: frozenset[str]
    values: dict[str, tuple[str, ...]]


@cache
def load(path: Path = DATA) -> ServerFlags:
    """The flag table shipped with autotune (see the module docstring)."""
    doc = json.loads(path.read_text())
    return ServerFlags(
        llama_cpp_python=doc["llama_cpp_python"], llama_cpp_commit=doc.get("llama_cpp_commit", ""),
        flags=frozenset(doc["server_flags"]), takes_value=frozenset(doc.get("takes_value", [])),
        values={k: tuple(v) for k, v in doc["values"].items()},
    )


def argv_reasons(argv: list[str], table: ServerFlags | None = None) -> list[str]:
    """Problems of a ``llama-server`` argv: unknown flags and values outside their set.

    ``argv[0]`` is the program. A flag that takes a value consumes the next item.
    """
    t = table or load()
    enum_of = {f: key for flags, key in ENUMS.items() for f in flags}
    problems: list[str] = []
    i = 1
    while i < len(argv):
        flag = argv[i]
        if not flag.startswith("-"):
            problems.append(f"unexpected argument {flag!r} (not a flag, and no flag before it takes a value)")
            i += 1
            continue
        if flag not in t.flags:
            problems.append(f"{flag} is not a llama-server flag in llama.cpp {t.llama_cpp_commit[:10] or ''} "
                            f"(llama-cpp-python {t.llama_cpp_python})")
            i += 1
            continue
        if flag in t.takes_value:
            value = argv[i + 1] if i + 1 < len(argv) else None
            if value is None:
                problems.append(f"{flag} needs a value")
            elif flag in enum_of:
                allowed = t.values[enum_of[flag]]
                for part in value.split(",") if enum_of[flag] == "spec_types" else [value]:
                    if part not in allowed:
                        problems.append(f"{flag} {part}: not one of {', '.join(allowed)}")
            i += 2
        else:
            i += 1
    return problems
