"""The pre-flight build of a JIT CUDA extension (exllamav2, exllamav3), with a real subprocess.

A stand-in package plays the library: importing its ``ext`` module takes torch's build lock
(as ``torch.utils.cpp_extension.load`` does) and either finishes or hangs. What is real: the
subprocess, its process group, the timeout, the lock files on disk.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from autotune.engines.cuda_ext import JitExtension
from autotune.engines.cuda_ext import build_extension

EXT_MODULE = """
import os, pathlib, time
d = pathlib.Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "py_cu" / "standin_ext"
d.mkdir(parents=True, exist_ok=True)
lock = d / "lock"
if lock.exists():
    while True:  # torch's FileBaton.wait(): a lock nobody removes is waited on for ever
        time.sleep(0.1)
lock.touch()
if os.environ.get("STANDIN_HANG"):
    time.sleep(600)
(d / "standin_ext.so").write_text("built")
lock.unlink()
"""


@pytest.fixture()
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JitExtension:
    pkg = tmp_path / "lib" / "standin"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ext.py").write_text(EXT_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "lib"), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    return JitExtension("standin", "standin.ext", "standin_ext", "pip install standin")


def test_a_stale_lock_is_removed_and_the_build_finishes(standin: JitExtension, tmp_path: Path) -> None:
    lock = tmp_path / "ext" / "py_cu" / "standin_ext" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    old = time.time() - 3600
    os.utime(lock, (old, old))  # left by a build killed an hour ago
    said: list[str] = []
    assert not standin.is_built()
    assert build_extension(standin, 60, say=said.append) == []
    assert standin.is_built() and not lock.exists()
    assert any("stale build lock" in m for m in said) and any("ready" in m for m in said)


def test_a_build_over_its_limit_is_killed_whole_and_leaves_no_lock(
        standin: JitExtension, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STANDIN_HANG", "1")
    t0 = time.monotonic()
    missing = build_extension(standin, 3, say=lambda m: None)
    assert time.monotonic() - t0 < 30
    assert missing and "did not build within 3 s" in missing[0]
    assert not list((tmp_path / "ext").glob("*/standin_ext/lock"))  # the next build is not blocked
    monkeypatch.delenv("STANDIN_HANG")
    assert build_extension(standin, 60, say=lambda m: None) == [] and standin.is_built()


def test_a_package_that_is_not_installed_is_named(tmp_path: Path) -> None:
    ext = JitExtension("no_such_pkg_xyz", "no_such_pkg_xyz.ext", "no_such_ext", "pip install xyz")
    assert build_extension(ext, 5, say=lambda m: None) == [
        "no_such_pkg_xyz is not installed (pip install xyz, see docs/gpu.md)"]


@pytest.mark.parametrize("engine", ["exllamav2", "exllamav3"])
def test_the_exllama_preflights_build_their_kernels(engine: str) -> None:
    import importlib.util

    from autotune.registry import get_engine_class

    cls = get_engine_class(engine)
    assert cls.preflight({}, build=False) == [] and cls.preflight({"build_extension": False}) == []
    if importlib.util.find_spec(engine) is not None:
        pytest.skip(f"{engine} is installed here: its real build is checked on a GPU machine")
    hint = {"exllamav2": "pip install 'autotune[gpu]'", "exllamav3": "pip install exllamav3"}[engine]
    assert cls.preflight({}) == [f"{engine} is not installed ({hint}, see docs/gpu.md)"]
