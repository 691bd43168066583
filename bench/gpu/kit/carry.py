"""What the lent GPU machine lacks and the GPU kit carries, derived from the packages' metadata.

The lent machine (Python 3.12, Linux x86_64, no network) has the packages of :data:`MACHINE`
(``shared/reference/GPU_MACHINE.md``, read there 2026-11-17). The kit needs :data:`ROOTS`
(exllamav2, exllamav3, gguf) and TabbyAPI's own dependencies (its ``pyproject.toml``). The
carry list is their closure: every ``Requires-Dist`` of every carried wheel (markers evaluated
for that machine, no extras) that the machine lacks is carried too, down to the leaves.

``python -m bench.gpu.kit.carry lock --wheels DIR [--tabby DIR] [--tabby-exl2 DIR]``
(``fetch_wheels.sh``, here, with network) downloads the closure into ``DIR`` and writes :data:`LOCK`
(``bench/gpu/carry.json``, committed): each carried wheel's version, file, size, requirements
and import names, and what it needs from the machine. ``tests/bench_gpu/test_gpu_carry.py`` checks
the committed lock is closed and covers what the kit's own code imports.

``python -m bench.gpu.kit.carry env`` (the lease's first step, seconds): every package
of the lock, carried or the machine's, is installed at a version its dependants accept, and
each one's modules really import (exllamav2 and exllamav3 excepted: importing them compiles
their kernels, which the ``ext`` stage does; their requirements are imported instead). On a
miss it prints one line naming what is missing and who needs it, and exits 2.
"""

from __future__ import annotations

import argparse
import email.parser
import importlib
import importlib.metadata as md
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[3]
LOCK = ROOT / "bench" / "gpu" / "carry.json"
ROOTS = {
    "exllamav2==0.3.2": "the ExLlamaV2 rows (TabbyAPI exl2-checkpoint's backend)",
    "exllamav3==1.6.5": "the ExLlamaV3 rows and TabbyAPI main's backend",
    "gguf": "writing the tiny GGUF for the llama.cpp CUDA rows",
    # pydantic-core >= 2.4x needs a newer typing-extensions than older machines hold; pip takes
    # the carried one only when the machine's is too old (installs resolve, never --no-deps)
    "typing-extensions>=4.14.1": "pydantic-core's lower bound, newer than some machines have",
}
TABBY_WHY = "TabbyAPI main (pyproject.toml)"
TABBY_EXL2_WHY = "TabbyAPI exl2-checkpoint (pyproject.toml)"
KERNEL_BUILDERS = frozenset({"exllamav2", "exllamav3"})  # importing them compiles CUDA kernels
# GPU_MACHINE.md's full list (2026-11-17); "nvidia-*" stands for the CUDA 13 libraries
MACHINE = frozenset(canonicalize_name(n) for n in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson
ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-ml-py onnx onnxruntime
opencv-python-headless optax opt-einsum orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov
pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests
rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())
# the lent machine, for evaluating requirement markers
MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
# its Python 3.12.3 is Ubuntu 24.04's (glibc 2.39): any manylinux wheel up to glibc 2.39 runs
PLATFORM_ARGS = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                 *[a for v in (39, 35, 34, 31, 28, 27, 24, 17) for a in
                   ("--platform", f"manylinux_2_{v}_x86_64")], "--platform", "manylinux2014_x86_64"]


def on_machine(name: str) -> bool:
    """Whether the lent machine has the distribution ``name``."""
    n = canonicalize_name(name)
    return n in MACHINE or n.startswith("nvidia-")


def applies(req: Requirement) -> bool:
    """Whether ``req`` applies on the lent machine (its marker, with no extra asked for)."""
    return req.marker is None or req.marker.evaluate(MARKERS)


def tabby_roots(tabby_dir: Path) -> list[str]:
    """TabbyAPI's ``[project] dependencies`` that apply on the lent machine."""
    import tomllib

    deps = tomllib.loads((tabby_dir / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d for d in deps if applies(Requirement(d))]


def wheel_facts(wheel: Path) -> dict:
    """A wheel's name, version, requirements (applying there) and top-level import names."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(meta_name).decode())
        top_txt = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        if top_txt:
            imports = z.read(top_txt[0]).decode().split()
        else:  # from the files: packages and top-level modules, not metadata or data
            imports = sorted({n.split("/")[0].removesuffix(".py") for n in names
                              if not n.split("/")[0].endswith((".dist-info", ".data"))
                              and (n.endswith(".py") or "/" in n)})
    reqs = [str(r) for r in map(Requirement, meta.get_all("Requires-Dist") or []) if applies(r)]
    imports = [i for i in imports if i.isidentifier() and not i.startswith("_")]
    return {"name": canonicalize_name(meta["Name"]), "version": meta["Version"], "file": wheel.name,
            "bytes": wheel.stat().st_size, "requires": reqs, "imports": sorted(set(imports))}


def download(req: str, dest: Path) -> Path:
    """``pip download`` one wheel for the lent machine into ``dest``; its path."""
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM_ARGS, "-d", str(dest), req]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"error: pip download {req} failed: {last[0]}")
    name = canonicalize_name(Requirement(req).name)
    new = [w for w in set(dest.glob("*.whl")) - before] or list(dest.glob("*.whl"))
    return next(w for w in sorted(new) if canonicalize_name(w.name.split("-")[0]) == name)


def merge_roots(roots: dict[str, str]) -> list[tuple[str, str]]:
    """One requirement per package: the roots' specifiers for it together (``pydantic==2.11.0``
    from TabbyAPI exl2-checkpoint with main's ``pydantic>=2.11,<3``), markers dropped (they
    were evaluated for the machine)."""
    merged: dict[str, tuple[list[str], list[str]]] = {}
    for spec, why in roots.items():
        req = Requirement(spec)
        specs, whys = merged.setdefault(canonicalize_name(req.name), ([], []))
        specs += [str(req.specifier)] if str(req.specifier) else []
        whys += [why] if why not in whys else []
    return [(name + ",".join(specs), "; ".join(whys)) for name, (specs, whys) in merged.items()]


def lock(roots: dict[str, str], dest: Path) -> dict:
    """The closure of ``roots`` (requirement -> why): carried wheels and the machine's share.

    A requirement the machine satisfies by name is not carried, unless :data:`ROOTS` names it.
    """
    dest.mkdir(parents=True, exist_ok=True)
    carried: dict[str, dict] = {}
    machine: dict[str, dict] = {}
    queue = merge_roots(roots)
    while queue:
        spec, why = queue.pop(0)
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        if on_machine(name) and not any(canonicalize_name(Requirement(r).name) == name for r in ROOTS):
            entry = machine.setdefault(name, {"specifiers": [], "needed_by": []})
            entry["specifiers"] = sorted({*entry["specifiers"], str(req.specifier)} - {""})
            entry["needed_by"] = sorted({*entry["needed_by"], why})
            continue
        if name in carried:
            carried[name]["needed_by"] = sorted({*carried[name]["needed_by"], why})
            continue
        facts = wheel_facts(download(spec, dest))
        carried[name] = {**facts, "needed_by": [why]}
        print(f"carried {name} {facts['version']} ({facts['bytes'] / 1e6:.2f} MB): {why}", flush=True)
        queue += [(r, name) for r in facts["requires"]]
    total = sum(c["bytes"] for c in carried.values())
    return {"python": MARKERS["python_version"], "roots": roots, "carried": dict(sorted(carried.items())),
            "machine": dict(sorted(machine.items())), "carried_bytes": total}


def closure_problems(data: dict) -> list[str]:
    """Requirements of carried wheels that neither the machine nor the carry list satisfies."""
    carried = data["carried"]
    out = []
    for name, c in carried.items():
        for spec in c["requires"]:
            req = Requirement(spec)
            dep = canonicalize_name(req.name)
            if dep in carried:
                if not req.specifier.contains(Version(carried[dep]["version"]), prereleases=True):
                    out.append(f"{name} needs {spec}; carried {dep} {carried[dep]['version']}")
            elif not on_machine(dep):
                out.append(f"{name} needs {spec}: not on the GPU machine and not carried")
            elif dep not in data["machine"]:
                out.append(f"{name} needs {spec}: missing from the lock's machine list")
    return out


def _import_names(dist: str) -> list[str]:
    """The top-level modules of an installed distribution, from its files."""
    d = md.distribution(dist)
    top = (d.read_text("top_level.txt") or "").split()
    if not top:
        top = sorted({str(f).split("/")[0].removesuffix(".py") for f in d.files or []
                      if not str(f).split("/")[0].endswith((".dist-info", ".data", ".pth"))
                      and (str(f).endswith(".py") or "/" in str(f))})
    return [t for t in top if t.isidentifier() and not t.startswith("_")]


def env_problems(data: dict, do_import: bool = True) -> tuple[list[str], list[str]]:
    """(problems, modules imported): the lock's packages installed, accepted and importable."""
    wanted: dict[str, list[str]] = {n: [] for n in data["carried"]}  # dist -> specifiers
    for n, m in data["machine"].items():
        wanted.setdefault(n, []).extend(m["specifiers"])
    for c in data["carried"].values():
        for spec in c["requires"]:
            r = Requirement(spec)
            wanted.setdefault(canonicalize_name(r.name), []).append(str(r.specifier))
    needers = {n: [k for k, c in data["carried"].items() if any(
        canonicalize_name(Requirement(s).name) == n for s in c["requires"])] for n in wanted}
    problems, imported = [], []
    for dist, specs in sorted(wanted.items()):
        by = ", ".join(needers[dist] or data["carried"].get(dist, {}).get("needed_by") or ["the kit"])
        try:
            have = md.version(dist)
        except md.PackageNotFoundError:
            problems.append(f"{dist} (needed by {by})")
            continue
        bad = [s for s in specs if s and not Requirement(f"x{s}").specifier.contains(
            Version(have.split("+")[0]), prereleases=True)]
        if bad:
            problems.append(f"{dist} {have} but {by} need(s) {', '.join(bad)}")
            continue
        if not do_import or dist in KERNEL_BUILDERS:
            continue
        for mod in _import_names(dist):
            try:
                importlib.import_module(mod)
                imported.append(mod)
            except Exception as e:  # noqa: BLE001 - any import failure is the finding
                problems.append(f"{dist}: import {mod} failed ({type(e).__name__}: {str(e)[:120]})")
    return problems, imported


def install_argv(data: dict, wheels: Path, python: str = sys.executable) -> list[str]:
    """pip installing the lock's roots from ``wheels`` only, resolving against what is installed.

    pip takes a carried wheel only where the machine lacks the package or holds a version a
    dependant refuses, and names the first requirement it cannot meet.
    """
    return [python, "-m", "pip", "install", "--no-index", "--find-links", str(wheels), "--quiet",
            *sorted(data["roots"])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu.kit.carry", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    lk = sub.add_parser("lock", help="download the closure (network) and write bench/gpu/carry.json")
    lk.add_argument("--wheels", default=str(ROOT / "bench" / "gpu" / "wheels"))
    lk.add_argument("--tabby", help="TabbyAPI main's source folder: its dependencies are carried too")
    lk.add_argument("--tabby-exl2", help="TabbyAPI exl2-checkpoint's source folder, the same")
    lk.add_argument("--lock", default=str(LOCK))
    ins = sub.add_parser("install", help="pip install the carried wheels there (no network)")
    ins.add_argument("--wheels", default=str(ROOT / "bench" / "gpu" / "wheels"))
    ins.add_argument("--lock", default=str(LOCK))
    ev = sub.add_parser("env", help="check, on the GPU machine, that everything imports")
    ev.add_argument("--lock", default=str(LOCK))
    ev.add_argument("--soft", action="store_true", help="report what is missing, exit 0 (a dry run)")
    a = ap.parse_args(argv)
    if a.cmd == "lock":
        roots = dict(ROOTS)
        old = json.loads(Path(a.lock).read_text())["roots"] if Path(a.lock).exists() else {}
        for folder, why in ((a.tabby, TABBY_WHY), (a.tabby_exl2, TABBY_EXL2_WHY)):
            specs = tabby_roots(Path(folder)) if folder else [d for d, w in old.items() if why in w.split("; ")]
            for d in specs:  # without the source here, the roots it gave last time
                roots[d] = f"{roots[d]}; {why}" if d in roots else why
        data = lock(roots, Path(a.wheels))
        Path(a.lock).write_text(json.dumps(data, indent=1) + "\n")
        problems = closure_problems(data)
        print(f"{len(data['carried'])} wheels, {data['carried_bytes'] / 2**20:.1f} MiB -> {a.lock}")
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        return 2 if problems else 0
    data = json.loads(Path(a.lock).read_text())
    if a.cmd == "install":
        done = subprocess.run(install_argv(data, Path(a.wheels)), capture_output=True, text=True, check=False)
        if done.returncode:
            why = [x for x in (done.stderr or done.stdout).splitlines() if "ERROR" in x][:1] or ["pip failed"]
            print(f"install: {why[0].strip()} (wheels: {a.wheels}; bash bench/gpu/fetch_wheels.sh)",
                  file=sys.stderr)
            return 2
        print(f"install: the kit's {len(data['roots'])} requirements are met from {a.wheels}")
        return 0
    problems, imported = env_problems(data)
    if problems:
        print(f"env: missing or broken on this machine: {'; '.join(problems)} "
              "(carry bench/gpu/wheels: bash bench/gpu/fetch_wheels.sh)", file=sys.stderr)
        return 0 if a.soft else 2
    print(f"env: every carried and needed package is here; imported {len(imported)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
