"""Each engine checks its own exported files (``Engine.check_export``); export.py only asks."""

from __future__ import annotations

import json
import os
from pathlib import Path

from autotune._files import insert_comments
from autotune.engines.base import Engine
from autotune.registry import get_engine_class

SCRIPT = ("#!/usr/bin/env sh\n# Winner exported by autotune.\n"
          "llama-server -m {model} --bogus-flag 3 -c 512\n")


def _llama_files(out: Path, model: str) -> list[Path]:
    kwargs, script = out / "llama_cpp_kwargs.json", out / "llama-server.sh"
    kwargs.write_text(json.dumps({"model_path": model}, indent=2) + "\n")
    script.write_text(SCRIPT.format(model=model))
    script.chmod(0o755)
    return [kwargs, script]


def test_llamacpp_checks_its_script_and_kwargs_and_writes_the_warnings_in(tmp_path):
    model = str(tmp_path / "gone.gguf")
    files = _llama_files(tmp_path, model)
    notes = get_engine_class("llamacpp").check_export(files)
    assert notes[0] == f"llama_cpp_kwargs.json: model_path {model} does not exist"
    assert any(n.startswith("llama-server.sh: --bogus-flag is not a llama-server flag")
               for n in notes)
    assert notes[-1] == f"llama-server.sh: model file {model} does not exist"
    lines = files[1].read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env sh"  # the warnings go after the shebang
    assert lines[1].startswith("# WARNING: --bogus-flag")
    assert lines[-1].startswith("llama-server -m")
    assert len([x for x in lines if x.startswith("# WARNING: ")]) == len(notes) - 1
    assert os.access(files[1], os.X_OK)  # still executable
    assert json.loads(files[0].read_text()) == {"model_path": model}  # the JSON is left as it is


def test_a_script_that_runs_gets_no_note_and_is_not_touched(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    files = _llama_files(tmp_path, str(model))
    files[1].write_text(files[1].read_text().replace(" --bogus-flag 3", ""))
    before = files[1].read_bytes()
    assert get_engine_class("llamacpp").check_export(files) == []
    assert files[1].read_bytes() == before


def test_an_engine_checks_only_its_own_files_and_the_default_is_no_check(tmp_path):
    files = _llama_files(tmp_path, str(tmp_path / "gone.gguf"))
    assert Engine.check_export(files) == []
    assert get_engine_class("fake").check_export(files) == []
    assert get_engine_class("llamacpp").check_export([tmp_path / "server.sh"]) == []


def test_insert_comments_after_a_shebang_or_at_the_top(tmp_path):
    script, plain = tmp_path / "a.sh", tmp_path / "b.yml"
    script.write_text("#!/bin/sh\necho hi\n")
    plain.write_text("model: {}\n")
    insert_comments(script, ["one", "two"])
    insert_comments(plain, ["three"])
    insert_comments(plain, [])
    assert script.read_text() == "#!/bin/sh\n# one\n# two\necho hi\n"
    assert plain.read_text() == "# three\nmodel: {}\n"
