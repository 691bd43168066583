"""Relative file paths are pinned to the directory `autotune run` started in."""

from __future__ import annotations

import os

from autotune.config.compose import compose
from autotune.config.schema import load_config


def test_relative_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # the files exist: missing ones are refused at load (tests/configs/bad/)
    (tmp_path / "my").mkdir()
    (tmp_path / "my" / "prompts.jsonl").write_text('{"prompt": "Hello there"}\n')
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "t.txt").write_text("Some text to measure perplexity on. " * 50)
    cfg = load_config(compose([
        "conf=local_cpu", "+engine.variants.mine.path=models/x.gguf",
        "workload.prompts=my/prompts.jsonl", "quality.text=texts/t.txt",
    ]))
    assert cfg.engine.variants["mine"]["path"] == str(tmp_path / "models" / "x.gguf")
    assert cfg.workload.prompts == str(tmp_path / "my" / "prompts.jsonl")
    assert cfg.quality.text == str(tmp_path / "texts" / "t.txt")
    assert cfg.raw["engine"]["variants"]["mine"]["path"].startswith(os.sep)


def test_names_of_shipped_sets_stay_names():
    cfg = load_config(compose(["conf=local_cpu", "workload=code"]))
    assert cfg.workload.prompts == "code" and cfg.quality.text == "gpl3"
