"""Extract the flags ``llama-server`` accepts from the llama.cpp sources llama-cpp-python vendors.

llama-cpp-python builds its own copy of llama.cpp (``vendor/llama.cpp`` in its sdist) but
ships no ``llama-server``; the exported ``llama-server.sh`` must still use flags that the
same llama.cpp accepts. This reads ``common/arg.cpp`` (every ``common_arg`` with the
examples it applies to) and ``common/speculative.cpp`` (speculative types) and writes
``autotune/engines/llamacpp/llama_server_flags.json``, which :mod:`autotune.engines.llamacpp.server_flags` checks
exported command lines against. Regenerate it when llama-cpp-python is upgraded::

    pip download --no-deps --no-binary :all: llama-cpp-python==VERSION -d /tmp/lcp
    tar xf /tmp/lcp/llama_cpp_python-VERSION.tar.gz -C /tmp/lcp
    python -m autotune.tools.llama_server_flags /tmp/lcp/llama_cpp_python-VERSION/vendor/llama.cpp \
        --version VERSION
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from autotune.engines.llamacpp.server_flags import DATA

_OPT = re.compile(r"add_opt\(common_arg\(")
_NAMES = re.compile(r"\{\s*((?:\"[^\"]+\"\s*,?\s*)+)\}(?:\s*,\s*\{\s*((?:\"[^\"]+\"\s*,?\s*)+)\})?")
_EXAMPLES = re.compile(r"\.set_examples\((?:\{([^}]*)\}|(\w+))\)")
_LISTS = re.compile(r"static std::initializer_list<enum llama_example> (\w+) = \{([^}]*)\}")
_EXCLUDES = re.compile(r"\.set_excludes\(\{([^}]*)\}\)")
_LAMBDA = re.compile(r"\[\]\(common_params\s*&\s*\w*\s*([,)])\s*(?:const\s+)?(\w*)")
_KV_TYPES = re.compile(r"kv_cache_types\s*=\s*\{([^}]*)\}")
_SPEC_TYPES = re.compile(r"\{\"([a-z0-9-]+)\",\s*COMMON_SPECULATIVE_TYPE_\w+\}")
# is_truthy / is_falsey / is_autoy spell the accepted words of on/off/auto flags
_BOOL_WORDS = re.compile(r"bool (?:common_arg_utils::)?is_(truthy|falsey|autoy)\(const std::string & value\) \{\s*"
                         r"return ([^;]+);")


def _names(text: str) -> list[str]:
    return re.findall(r"\"([^\"]+)\"", text)


def _split(text: str) -> list[str]:
    return sorted(x.strip() for x in text.split(",") if x.strip())


def parse_args_cpp(arg_cpp: str) -> dict[str, dict]:
    """Flag -> {"examples": [...] or [] for every tool, "excludes": [...], "takes_value": bool}."""
    out: dict[str, dict] = {}
    lists = dict(_LISTS.findall(arg_cpp))
    chunks = _OPT.split(arg_cpp)[1:]
    for chunk in chunks:
        head = _NAMES.match(chunk.lstrip())
        if not head:
            continue
        names = _names(head.group(1)) + _names(head.group(2) or "")
        rest = chunk.lstrip()[head.end():]
        lam = _LAMBDA.search(rest)
        end = chunk.find("add_opt(")
        tail = chunk if end < 0 else chunk[:end]
        ex = _EXAMPLES.search(tail)
        exc = _EXCLUDES.search(tail)
        examples = ["LLAMA_EXAMPLE_COMMON"]  # common_arg's default (arg.h)
        if ex:
            examples = _split(ex.group(1) if ex.group(1) is not None else lists.get(ex.group(2), ""))
        entry = {
            "examples": examples,
            "excludes": _split(exc.group(1)) if exc else [],
            # a bool handler (``{"--x"}, {"--no-x"}`` pairs) or none at all takes no value
            "takes_value": bool(lam and lam.group(1) == "," and lam.group(2) != "bool"),
        }
        for n in names:
            out[n] = entry
    return out


def build(src: Path, version: str, commit: str) -> dict:
    """The JSON document for llama.cpp sources at ``src`` (the vendored llama.cpp folder)."""
    arg_cpp = (src / "common" / "arg.cpp").read_text()
    spec_cpp = (src / "common" / "speculative.cpp").read_text()
    flags = parse_args_cpp(arg_cpp)
    # arg.cpp's add_opt: every tool inherits LLAMA_EXAMPLE_COMMON options unless excluded
    server = sorted(f for f, e in flags.items()
                    if {"LLAMA_EXAMPLE_COMMON", "LLAMA_EXAMPLE_SERVER"} & set(e["examples"])
                    and "LLAMA_EXAMPLE_SERVER" not in e["excludes"])
    kv = _KV_TYPES.search(arg_cpp)
    kv_types = [t.strip().removeprefix("GGML_TYPE_").lower() for t in kv.group(1).split(",") if t.strip()]
    words = {k: re.findall(r"\"([^\"]+)\"", v) for k, v in _BOOL_WORDS.findall(arg_cpp)}
    return {
        "llama_cpp_python": version, "llama_cpp_commit": commit,
        "source": "vendor/llama.cpp/common/arg.cpp and common/speculative.cpp of the llama-cpp-python sdist",
        "server_flags": server,
        "takes_value": sorted(f for f in server if flags[f]["takes_value"]),
        "values": {
            "kv_cache_types": kv_types,
            "spec_types": sorted(set(_SPEC_TYPES.findall(spec_cpp))),
            "on_off_auto": sorted({w for k in ("truthy", "falsey", "autoy") for w in words.get(k, [])}),
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autotune.tools.llama_server_flags",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("llama_cpp_dir", type=Path, help="the vendored llama.cpp folder of the sdist")
    p.add_argument("--version", required=True, help="llama-cpp-python version of that sdist")
    p.add_argument("--commit", default="", help="llama.cpp commit (from its .git, if known)")
    p.add_argument("--out", type=Path, default=DATA)
    a = p.parse_args(argv)
    doc = build(a.llama_cpp_dir, a.version, a.commit)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(doc['server_flags'])} llama-server flags -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
