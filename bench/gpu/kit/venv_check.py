"""Check here, before a lease, that the carried wheels and the machine's packages suffice.

``python -m bench.gpu.kit.venv_check`` (the end of ``bench/gpu/prepare.sh``) builds a clean
Python 3.12 venv from two sources only, both with ``pip --no-index``: the carried wheels
(``bench/gpu/wheels``) and wheels of the lent machine's own packages (those of
:data:`bench.gpu.kit.carry.MACHINE` that the lock needs, with their dependencies on that
list, fetched once into ``~/.cache/autotune/gpu-machine-wheels``). torch, triton and the CUDA
libraries are left out (gigabytes; the machine has them), so exllamav2 and exllamav3 go in
with ``--no-deps``. Then, in that venv, every module of TabbyAPI's source (``common``,
``endpoints``, ``backends/exllamav3``, ``main``; exl2-checkpoint's too, with
``backends/exllamav2``) and of every carried wheel is imported: an
import that fails for want of torch (or what only a GPU build provides) is reported as not
checkable on CPU; any other failure (a missing package above all) is an error, exit 2. Last,
each branch's TabbyAPI loads the config autotune exports for it with its own loader (as at
startup), and every exported key must be read back unchanged.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from autotune.engines.variants import cache_dir
from bench.gpu.kit.carry import KERNEL_BUILDERS
from bench.gpu.kit.carry import LOCK
from bench.gpu.kit.carry import ROOT
from bench.gpu.kit.carry import download
from bench.gpu.kit.carry import on_machine
from bench.gpu.kit.carry import wheel_facts

NOT_FETCHED = ("torch", "triton", "nvidia-", "cuda-")  # on the machine; too large to fetch here
# modules only the GPU machine provides: an import failing on one of them is not a finding here
GPU_ONLY = {"torch", "triton", "exllamav2_ext", "exllamav3_ext", "flash_attn", "infinity_emb", "winloop"}
TABBY_PARTS = ("common", "endpoints", "backends/exllamav3", "backends/exllamav2")
IMPORTS = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        out[name] = ""
    except BaseException as e:
        missing = getattr(e, "name", None) if isinstance(e, ImportError) else None
        out[name] = json.dumps([type(e).__name__, str(e)[:200], missing])
print(json.dumps(out))
"""


LOAD_CONFIG = """
import json, os, sys
import yaml
sys.path.insert(0, sys.argv[1])
from common.tabby_config import config
config.load({})
bad = []
for section, values in yaml.safe_load(open("config.yml")).items():
    obj = getattr(config, section, None)
    for key, wrote in (values or {}).items():
        if obj is None or key not in type(obj).model_fields:
            bad.append(f"{section}.{key}: not a TabbyAPI option")
            continue
        got = getattr(obj, key)
        got = getattr(got, "value", got)
        if wrote is not None and got != wrote and str(got) != str(wrote):
            bad.append(f"{section}.{key}: exported {wrote!r}, TabbyAPI read {got!r}")
print(json.dumps(bad))
"""


def config_problems(vpy: str, tree: Path, branch: str, work: Path) -> list[str]:
    """Load autotune's export for ``branch`` with TabbyAPI's own loader (``config.load`` on a
    ``config.yml`` in the working directory, as at startup); every exported key must be an
    option TabbyAPI reads back unchanged (``null``, which TabbyAPI drops before validating,
    means its default)."""
    from bench.gpu.kit.tabby import export

    variants = {"e4": {"path": str(work / "models" / "exl3-t4")},
                "t4": {"path": str(work / "models" / "exl2-t4"), "bpw": 4.0}}
    run_dir = work / f"config-{branch}"
    run_dir.mkdir(parents=True, exist_ok=True)
    _, path = export(branch, variants, work)
    (run_dir / "config.yml").write_text(path.read_text())
    done = subprocess.run([vpy, "-c", LOAD_CONFIG, str(tree)], capture_output=True, text=True, cwd=run_dir,
                          check=False)
    if done.returncode:
        return [f"TabbyAPI {branch} could not load the export: {done.stderr.strip().splitlines()[-1:]}"]
    return [f"{branch}: {b}" for b in json.loads(done.stdout.strip().splitlines()[-1])]


def fetched(name: str) -> bool:
    n = canonicalize_name(name)
    return not any(n == p or (p.endswith("-") and n.startswith(p)) for p in NOT_FETCHED)


def machine_wheels(data: dict, dest: Path) -> tuple[list[Path], list[str]]:
    """The machine's packages the lock needs, and their machine-list dependencies, as wheels.

    Returns (wheels, notes). The newest version of each is fetched (the machine's versions are
    not on its list); a dependency of one that is neither on the list nor carried is fetched
    too and noted: pip installed the machine's packages with their dependencies, so such a
    name is version skew between today's wheel and the machine's, not a gap the lease meets.
    """
    dest.mkdir(parents=True, exist_ok=True)
    queue = [n for n in data["machine"] if fetched(n)]
    seen: set[str] = set()
    wheels, problems = [], []
    while queue:
        name = canonicalize_name(queue.pop(0))
        if name in seen:
            continue
        seen.add(name)
        have = [w for w in dest.glob("*.whl") if canonicalize_name(w.name.split("-")[0]) == name]
        wheel = have[0] if have else download(name, dest)
        wheels.append(wheel)
        for spec in wheel_facts(wheel)["requires"]:
            dep = canonicalize_name(Requirement(spec).name)
            if dep in data["carried"] or not fetched(dep):
                continue
            if not on_machine(dep):
                problems.append(f"today's {name} needs {spec}, not on the machine's list: fetched")
            queue.append(dep)
    return wheels, problems


def tabby_modules(tabby: Path) -> list[str]:
    """TabbyAPI's importable modules (its server, config, endpoints and exllamav3 backend)."""
    mods = ["main"]
    for part in TABBY_PARTS:
        for f in sorted((tabby / part).rglob("*.py")):
            rel = f.relative_to(tabby).with_suffix("")
            mods.append(".".join(p for p in rel.parts if p != "__init__") if rel.name == "__init__"
                        else ".".join(rel.parts))
    return mods


def classify(results: dict[str, str]) -> tuple[list[str], list[str]]:
    """(not checkable on CPU, errors) from the venv's import results. A module that fails only
    inside a cycle of TabbyAPI's own modules when imported first (exl2-checkpoint's
    ``common.multimodal``) is not a missing package: listed with the unchecked ones."""
    cpu_only, errors = [], []
    for mod, res in results.items():
        if not res:
            continue
        kind, text, missing = json.loads(res)
        root = (missing or "").split(".")[0]
        if root in GPU_ONLY or "CUDA" in text or "nvcc" in text:
            cpu_only.append(f"{mod} ({root or kind})")
        elif "partially initialized module" in text:  # TabbyAPI's own cycle entered from here
            cpu_only.append(f"{mod} (an import cycle of TabbyAPI's own, entered from this module)")
        else:
            errors.append(f"{mod}: {kind}: {text}")
    return cpu_only, errors


def find_python312(given: str | None) -> str | None:
    """A working Python 3.12: ``given``, else ``python3.12``, else pyenv's 3.12 builds."""
    import glob

    cands = [given] if given else ["python3.12", *sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.12*/bin/python3.12")))]
    for c in cands:
        try:
            out = subprocess.run([c, "--version"], capture_output=True, text=True, timeout=30, check=False)
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.startswith("Python 3.12"):
            return c
    return None


def run(venv: Path, wheels: Path, trees: list[Path], machine_dir: Path, python: str = "python3.12") -> int:
    """Build the venv, import every module of the TabbyAPI ``trees`` and the carried wheels;
    0 when nothing fails but for want of torch or kernels, else 2 (the reasons on stderr)."""
    data = json.loads(LOCK.read_text())
    mwheels, notes = machine_wheels(data, machine_dir)
    problems: list[str] = []
    subprocess.run([python, "-m", "venv", "--clear", str(venv)], check=True)
    vpy = str(venv / "bin" / "python")
    pip = [vpy, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels),
           "--find-links", str(machine_dir)]
    roots = [r for r in data["roots"] if canonicalize_name(Requirement(r).name) not in KERNEL_BUILDERS]
    roots += [r for n in KERNEL_BUILDERS for r in data["carried"][n]["requires"]  # less torch
              if fetched(Requirement(r).name)]
    done = subprocess.run([*pip, *roots], capture_output=True, text=True, check=False)
    if done.returncode:
        problems.append("pip: " + " | ".join(x for x in done.stderr.splitlines() if "ERROR" in x)[:400])
    kernels = [str(wheels / c["file"]) for n, c in data["carried"].items() if n in KERNEL_BUILDERS]
    subprocess.run([*pip, "--no-deps", *kernels], check=True)
    results: dict[str, str] = {}
    carried_mods = sorted({m for c in data["carried"].values() for m in c["imports"]})
    for i, tree in enumerate(t for t in trees if (t / "main.py").is_file()):
        mods = tabby_modules(tree) + (carried_mods if i == 0 else [])
        res = subprocess.run([vpy, "-c", IMPORTS, *mods], capture_output=True, text=True, cwd=tree, check=False)
        if res.returncode:
            problems.append(f"the import run in {tree.name} failed: {res.stderr.strip()[-300:]}")
            continue
        got = json.loads(res.stdout.strip().splitlines()[-1])
        for m in [m for m, v in got.items() if v and not classify({m: v})[0]]:
            # an import order artefact (a cycle entered from the middle)? again, in its own process
            alone = subprocess.run([vpy, "-c", IMPORTS, m], capture_output=True, text=True, cwd=tree, check=False)
            if alone.returncode == 0:
                got[m] = json.loads(alone.stdout.strip().splitlines()[-1])[m]
        results.update({f"{tree.name}:{m}" if m in tabby_modules(tree) else m: v for m, v in got.items()})
    cpu_only, errors = classify(results)
    for tree, branch in zip(trees, ("main", "exl2")):
        if (tree / "main.py").is_file():
            errors += config_problems(vpy, tree, branch, venv.parent / "gpu-venv-configs")
    ok = sum(1 for v in results.values() if not v)
    print(f"venv {venv} ({len(mwheels)} machine wheels + carried): {ok} of {len(results)} modules import; "
          f"{len(cpu_only)} not checkable here (torch, kernels, or an import cycle of TabbyAPI's own); "
          "TabbyAPI's own config loader read autotune's exports")
    for line in notes:
        print(f"note: {line}")
    for line in problems + errors:
        print(f"error: {line}", file=sys.stderr)
    return 2 if problems or errors else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu.kit.venv_check", description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=str(cache_dir().parent / "gpu-venv"))
    ap.add_argument("--wheels", default=str(ROOT / "bench" / "gpu" / "wheels"))
    ap.add_argument("--tabby", default=str(ROOT / "bench" / "gpu" / "tabbyAPI"))
    ap.add_argument("--tabby-exl2", default=str(ROOT / "bench" / "gpu" / "tabbyAPI-exl2"))
    ap.add_argument("--machine-wheels", default=str(cache_dir().parent / "gpu-machine-wheels"))
    ap.add_argument("--python", help="a Python 3.12, the machine's version (default: found)")
    a = ap.parse_args(argv)
    if not (Path(a.tabby) / "main.py").is_file():
        print(f"error: no TabbyAPI source at {a.tabby}: run bench/gpu/prepare.sh", file=sys.stderr)
        return 2
    python = find_python312(a.python)
    if python is None:
        print(f"error: --python={a.python or 'python3.12'} is no working Python 3.12 (the machine's version)",
              file=sys.stderr)
        return 2
    return run(Path(a.venv), Path(a.wheels), [Path(a.tabby), Path(a.tabby_exl2)], Path(a.machine_wheels), python)


if __name__ == "__main__":
    sys.exit(main())
