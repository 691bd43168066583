"""The GPU kit's carry list (bench/gpu/carry.json): closed over its wheels' requirements, and
covering every third-party module the kit's own code imports that the lent machine lacks.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from bench.gpu.kit import carry
from bench.gpu.kit.carry import LOCK
from bench.gpu.kit.carry import closure_problems
from bench.gpu.kit.carry import env_problems
from bench.gpu.kit.carry import on_machine
from bench.gpu.kit.carry import wheel_facts

ROOT = Path(__file__).resolve().parents[2]
DATA = json.loads(LOCK.read_text())
# the kit's entry points on the GPU machine: the staged check, the trial worker, the engines
TRACE = """
import importlib.metadata as md, json, sys
before = set(sys.modules)
import bench.gpu.kit.check, bench.gpu.kit.lease, bench.gpu.kit.carry, autotune.trial.worker
from autotune.registry import get_engine_class
for e in ("exllamav2", "exllamav3", "llamacpp", "llama_server", "tabbyapi"):
    get_engine_class(e)
tops = {m.split(".")[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)
dists = md.packages_distributions()
def installed(t):  # a module with a file in site-packages (runtime internals have none)
    return "-packages" in str(getattr(sys.modules.get(t), "__file__", None) or "")
print(json.dumps({t: dists.get(t, ["no distribution"]) for t in sorted(tops)
                  if t != "autotune" and (t in dists or installed(t))}))
"""


def test_the_committed_lock_is_closed() -> None:
    """Every requirement of every carried wheel is carried or on the lent machine."""
    assert closure_problems(DATA) == []
    assert "pydantic" in DATA["carried"] and "pydantic-core" in DATA["carried"]
    assert DATA["carried_bytes"] < 40 * 2**20  # leaves room for llama.cpp's source in 64 MiB


def test_a_missing_requirement_is_named() -> None:
    data = json.loads(json.dumps(DATA))
    del data["carried"]["pydantic-core"]
    assert closure_problems(data) == [
        "pydantic needs pydantic-core==" + DATA["carried"]["pydantic-core"]["version"]
        + ": not on the GPU machine and not carried"]


def test_the_kits_roots_are_carried_with_their_reason() -> None:
    for spec, why in carry.ROOTS.items():
        name = canonicalize_name(Requirement(spec).name)
        assert name in DATA["carried"] and why in DATA["carried"][name]["needed_by"]
    tabby = [r for r, w in DATA["roots"].items() if carry.TABBY_WHY in w.split("; ")]
    assert any(r.startswith("pydantic") for r in tabby) and any(r.startswith("fastapi") for r in tabby)


def test_tabbyapis_dependencies_are_in_the_lock() -> None:
    """When prepare.sh has put TabbyAPI's source here, the lock holds its current dependencies."""
    tabby = ROOT / "bench" / "gpu" / "tabbyAPI"
    if not (tabby / "pyproject.toml").is_file():
        pytest.skip("bench/gpu/tabbyAPI is prepared before a lease, not in CI")
    assert set(carry.tabby_roots(tabby)) <= set(DATA["roots"])
    exl2 = tabby.parent / "tabbyAPI-exl2"
    if (exl2 / "pyproject.toml").is_file():
        assert set(carry.tabby_roots(exl2)) <= set(DATA["roots"])


def test_what_the_kits_code_imports_is_there_or_carried() -> None:
    """Third-party modules that the kit's entry points import: on the machine or carried."""
    done = subprocess.run([sys.executable, "-c", TRACE], capture_output=True, text=True, timeout=180,
                          cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    missing = {mod: dists for mod, dists in imported.items()
               if not any(on_machine(d) or canonicalize_name(d) in DATA["carried"] for d in dists)}
    assert missing == {}, f"import on the GPU machine would fail: {missing}"


def test_wheel_facts_read_a_real_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "demo_pkg-1.0-py3-none-any.whl"
    meta = ("Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\nRequires-Dist: pydantic>=2\n"
            "Requires-Dist: winloop; platform_system == 'Windows'\nRequires-Dist: pytest; extra == 'dev'\n")
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("demo_pkg/__init__.py", "")
        z.writestr("demo_pkg-1.0.dist-info/METADATA", meta)
    facts = wheel_facts(wheel)
    assert (facts["name"], facts["version"], facts["requires"], facts["imports"]) == (
        "demo-pkg", "1.0", ["pydantic>=2"], ["demo_pkg"])


def test_the_env_check_names_what_is_missing_here() -> None:
    """Run for real on this machine: packages it lacks are named with who needs them."""
    data = {"carried": {"no-such-dist-xyz": {"version": "1", "requires": []}},
            "machine": {"packaging": {"specifiers": [">=99"], "needed_by": ["demo"]}}}
    problems, _ = env_problems(data, do_import=False)
    assert problems[0].startswith("no-such-dist-xyz (needed by")
    assert any(p.startswith("packaging ") and ">=99" in p for p in problems)
    ok, imported = env_problems({"carried": {}, "machine": {"packaging": {"specifiers": []}}})
    assert ok == [] and "packaging" in imported


def test_the_venv_check_sorts_gpu_only_imports_from_real_failures(tmp_path: Path) -> None:
    """venv_check's pure parts: TabbyAPI's module list and the classification of import results."""
    from bench.gpu.kit.venv_check import classify
    from bench.gpu.kit.venv_check import fetched
    from bench.gpu.kit.venv_check import tabby_modules

    for rel in ("main.py", "common/__init__.py", "common/args.py", "endpoints/OAI/router.py",
                "backends/exllamav3/model.py", "backends/infinity/model.py", "tests/x.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert tabby_modules(tmp_path) == ["main", "common", "common.args", "endpoints.OAI.router",
                                       "backends.exllamav3.model"]
    results = {"a": "", "b": json.dumps(["ModuleNotFoundError", "No module named 'torch'", "torch"]),
               "c": json.dumps(["ModuleNotFoundError", "No module named 'pydantic'", "pydantic"])}
    assert classify(results) == (["b (torch)"], ["c: ModuleNotFoundError: No module named 'pydantic'"])
    cycle = json.dumps(["ImportError", "cannot import name 'X' from partially initialized module 'm'", None])
    assert classify({"d": cycle})[1] == []
    assert not fetched("torch") and not fetched("nvidia-cublas") and fetched("pydantic")
