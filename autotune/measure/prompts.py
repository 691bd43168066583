"""Prompt sets: the shipped ones by name, or a user's .jsonl / .txt file."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path


def prompt_sets() -> list[str]:
    """Names of the prompt sets shipped with autotune."""
    root = resources.files("autotune") / "data" / "prompts"
    return sorted(p.name.removesuffix(".jsonl") for p in root.iterdir() if p.name.endswith(".jsonl"))


def load_prompts(name: str) -> list[str]:
    """A shipped prompt set by name, or a .jsonl ({"prompt": ...} per line) / .txt file path.

    A ``.txt`` file holds prompts separated by two blank lines.
    """
    path = Path(name)
    if not path.suffix:
        path = Path(str(resources.files("autotune") / "data" / "prompts" / f"{name}.jsonl"))
        if not path.exists():
            raise FileNotFoundError(
                f"unknown prompt set {name!r}: expected one of {', '.join(prompt_sets())} "
                "or a path to a .jsonl / .txt file"
            )
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]
    return [p for p in text.split("\n\n\n") if p.strip()]
