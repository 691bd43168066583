"""No import cycle between the project's modules, counting every import statement.

The scan reads each module with `ast` and collects the imports at module level, inside functions
and under `if TYPE_CHECKING:` alike: an import deferred into a function still ties two modules
together, it only hides the cycle from the interpreter. `from pkg.a import b` points at the module
`pkg.a.b` when that is a module, else at `pkg.a`. Lazy registries that name a module in a string
(`"autotune.engines.vllm.engine:VLLM"`) are not imports and are not counted.

Also: starting the CLI (`import autotune.cli.main`, `autotune --help`) loads no heavy library; those
are imported where they are used (the trial worker, the driver, a sub-command's function).

Layering: every stage imports only the stages below it, for the whole package (`STAGES`, top to
bottom as shared/design/LAYOUT.md draws them), counting the same statements; and `measure/`
reaches an engine only through the `Generator` protocol (no `getattr(engine, ...)`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("autotune",)
# Top-level folders a build maps into the package (setup.py): scanned under their dotted name.
MAPPED = {"objectives": "autotune.objectives"}


@dataclass(frozen=True)
class Edge:
    """One import statement: `source` imports `target` at `line` of `path`."""

    source: str
    target: str
    path: str
    line: int


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Map each dotted module name of `packages` (under `root`, plus its MAPPED folders) to its file."""
    folders = [(root / package, [package]) for package in packages]
    folders += [(root / folder, dotted.split(".")) for folder, dotted in MAPPED.items()
                if dotted.split(".")[0] in packages]
    modules: dict[str, Path] = {}
    for folder, prefix in folders:
        for path in sorted(folder.rglob("*.py")):
            parts = [*prefix, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest dotted prefix of `name` that is one of `modules`, or None."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _targets(node: ast.AST, module: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        found = (_resolve(alias.name, modules) for alias in node.names)
        return [target for target in found if target]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module.split(".")
        if not is_package:
            package.pop()
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    targets = []
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        target = submodule if submodule in modules else _resolve(base, modules)
        if target:
            targets.append(target)
    return targets


def import_edges(root: Path, packages: tuple[str, ...]) -> list[Edge]:
    """Every import between two modules of `packages`, wherever the statement stands."""
    modules = module_files(root, packages)
    edges = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            for target in _targets(node, module, is_package, modules):
                if target != module:
                    rel = str(path.relative_to(root))
                    edges.append(Edge(module, target, rel, node.lineno))
    return edges


@dataclass(frozen=True)
class Cycle:
    """A group of modules that import each other, and one shortest loop through it."""

    members: tuple[str, ...]
    edges: tuple[Edge, ...]


def find_cycles(edges: list[Edge]) -> list[Cycle]:
    """Each strongly connected group of two or more modules (Tarjan), with one loop through it."""
    graph: dict[str, dict[str, Edge]] = {}
    for edge in edges:
        graph.setdefault(edge.source, {}).setdefault(edge.target, edge)
        graph.setdefault(edge.target, {})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [
        Cycle(tuple(sorted(group)), tuple(_shortest_cycle(min(group), group, graph)))
        for group in groups
    ]


def _shortest_cycle(start: str, group: set[str], graph: dict[str, dict[str, Edge]]) -> list[Edge]:
    paths: dict[str, list[Edge]] = {start: []}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt, edge in sorted(graph[node].items()):
                if nxt == start:
                    return [*paths[node], edge]
                if nxt in group and nxt not in paths:
                    paths[nxt] = [*paths[node], edge]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def describe(cycle: Cycle) -> str:
    """`a -> b -> a`, the import line behind each arrow, and every module of the group."""
    chain = " -> ".join([cycle.edges[0].source, *(edge.target for edge in cycle.edges)])
    lines = [f"    {e.source} -> {e.target}  ({e.path}:{e.line})" for e in cycle.edges]
    group = f"    (all {len(cycle.members)} tied together: {', '.join(cycle.members)})"
    return "\n".join([chain, *lines, group])


def test_no_import_cycle_in_the_package():
    edges = import_edges(ROOT, PACKAGES)
    assert len(edges) > 50, "the scan found almost no imports: is it reading the package?"
    cycles = find_cycles(edges)
    if cycles:
        pytest.fail("import cycles:\n" + "\n".join(describe(c) for c in cycles), pytrace=False)


HEAVY = ("ray", "mlflow", "torch", "optuna", "hydra", "omegaconf", "numpy", "llama_cpp",
         "vllm", "exllamav2", "transformers", "plotly", "kaleido", "pandas")
LOADED = """
import contextlib, io, sys
import autotune, autotune.cli.main
if sys.argv[1:]:
    sys.argv = ["autotune", *sys.argv[1:]]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        autotune.cli.main.main()
print(" ".join(sorted({name.split(".")[0] for name in sys.modules})))
"""


@pytest.mark.parametrize("argv", [[], ["--help"], ["run", "--help"]], ids=["import", "help", "run-help"])
def test_the_cli_starts_without_heavy_libraries(argv):
    proc = subprocess.run([sys.executable, "-c", LOADED, *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stdout.split())
    assert "autotune" in loaded
    assert not loaded & set(HEAVY), f"imported at start-up: {sorted(loaded & set(HEAVY))}"


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


CYCLIC = {  # case: (files of a package `pkg`, the modules of its one cycle)
    "in_function": (
        {"pkg/a.py": "from pkg.b import f\n", "pkg/b.py": "def f():\n    from pkg import a\n"},
        {"pkg.a", "pkg.b"},
    ),
    "type_checking": (
        {
            "pkg/a.py": "import pkg.b\n",
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import X\n",
        },
        {"pkg.a", "pkg.b"},
    ),
    "relative_three_modules": (
        {
            "pkg/sub/__init__.py": "",
            "pkg/sub/a.py": "from . import b\n",
            "pkg/sub/b.py": "from ..c import g\n",
            "pkg/c.py": "def g():\n    from .sub.a import h\n",
        },
        {"pkg.c", "pkg.sub.a", "pkg.sub.b"},
    ),
}


@pytest.mark.parametrize("case", sorted(CYCLIC))
def test_the_scan_finds_a_hidden_cycle(tmp_path, case):
    files, members = CYCLIC[case]
    _write(tmp_path, {"pkg/__init__.py": "", **files})
    cycles = find_cycles(import_edges(tmp_path, ("pkg",)))
    assert len(cycles) == 1
    assert {edge.source for edge in cycles[0].edges} == members
    assert set(cycles[0].members) == members
    assert describe(cycles[0]).startswith(f"{min(members)} -> ")


def test_the_scan_ignores_acyclic_and_outside_imports(tmp_path):
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import x\n",
            "pkg/a.py": "import os\nfrom pkg import b\nx = 1\n",
            "pkg/b.py": "import json\nfrom pkg.c import y\n",
            "pkg/c.py": "y = 2\n",
        },
    )
    edges = import_edges(tmp_path, ("pkg",))
    assert {(e.source, e.target) for e in edges} == {
        ("pkg", "pkg.a"),
        ("pkg.a", "pkg.b"),
        ("pkg.b", "pkg.c"),
    }
    assert find_cycles(edges) == []


# ---- layering: every stage imports only the stages below it (shared/design/LAYOUT.md) ---------
# Top to bottom. `tools` and `testing` sit beside the CLI (nothing in the package imports them);
# the modules directly under autotune/ (errors, hardware, the engine registry, small helpers)
# are the bottom. A stage may import itself and anything below it, never above.
STAGES = (("cli", "tools", "testing"), ("run",), ("output",), ("record",), ("config",),
          ("search",), ("engines",), ("trial",), ("measure",), ("objectives",))


def stage_rank(module: str, package: str = "autotune") -> int:
    """0 for the top stage, increasing downwards; the bottom (package-level modules) is last."""
    parts = module.split(".")
    if parts[0] != package or len(parts) < 2:
        return len(STAGES)
    for rank, names in enumerate(STAGES):
        if parts[1] in names:
            return rank
    return len(STAGES)


def layer_violations(edges: list[Edge], package: str = "autotune") -> list[Edge]:
    """The imports that point up: from a module into a stage above its own (every statement)."""
    return [e for e in edges if stage_rank(e.target, package) < stage_rank(e.source, package)]


def test_the_stage_list_names_every_folder_of_the_package():
    folders = {p.name for p in (ROOT / "autotune").iterdir()
               if p.is_dir() and (p / "__init__.py").is_file()}
    named = {name for names in STAGES for name in names}
    assert folders - {"objectives"} <= named, f"a stage folder is missing from STAGES: {folders - named}"
    assert named <= folders | {"objectives"}, f"STAGES names a folder that is gone: {named - folders}"


def engine_getattrs(root: Path, package: str = "autotune.measure") -> list[str]:
    """`getattr(engine, ...)` / `hasattr(engine, ...)` calls in `package`: `path:line` each.

    measure/ reaches an engine only through the members of the `Generator` protocol.
    """
    found = []
    for module, path in module_files(root, (package.split(".")[0],)).items():
        if module != package and not module.startswith(f"{package}."):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and node.args):
                first = node.args[0]
                name = first.id if isinstance(first, ast.Name) else getattr(first, "attr", "")
                if "engine" in name.lower():
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_every_stage_imports_only_the_stages_below_it():
    bad = layer_violations(import_edges(ROOT, PACKAGES))
    if bad:
        lines = [f"    {e.source} -> {e.target}  ({e.path}:{e.line})" for e in bad]
        pytest.fail("an import points up the stages (pass the data down instead, or move the code "
                    "into the lower stage):\n" + "\n".join(lines), pytrace=False)


def test_measure_reaches_engines_only_through_the_generator_protocol():
    assert engine_getattrs(ROOT) == []


LAYERED = {  # case: (files of a package `autotune` in a temp dir, the offending imports)
    "module_level": ({"autotune/engines/a.py": "from autotune.config.schema import Config\n"},
                     {("autotune.engines.a", "autotune.config.schema")}),
    "in_function": ({"autotune/measure/a.py": "def f():\n    from autotune.record import summary\n"},
                    {("autotune.measure.a", "autotune.record.summary")}),
    "type_checking": ({"autotune/trial/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                              "    import autotune.output.export\n"},
                      {("autotune.trial.a", "autotune.output.export")}),
    "search_into_record": ({"autotune/search/a.py": "from autotune.record.summary import x\n"},
                           {("autotune.search.a", "autotune.record.summary")}),
    "output_into_run": ({"autotune/output/a.py": "from autotune.run import plan\n"},
                        {("autotune.output.a", "autotune.run.plan")}),
    "bottom_into_a_stage": ({"autotune/helper.py": "from autotune.engines import a\n"},
                            {("autotune.helper", "autotune.engines.a")}),
    "downwards_is_fine": ({"autotune/config/schema.py": "from autotune.engines import a\n",
                           "autotune/engines/a.py": "from autotune.measure import b\n",
                           "autotune/measure/b.py": "from autotune import errors\n"}, set()),
}


@pytest.mark.parametrize("case", sorted(LAYERED))
def test_the_layer_check_sees_every_import_statement(tmp_path, case):
    files, expected = LAYERED[case]
    packages = ["autotune", *(f"autotune/{p}" for p in ("engines", "measure", "trial", "config",
                                                          "record", "output", "run", "search"))]
    _write(tmp_path, {f"{p}/__init__.py": "" for p in packages}
           | {"autotune/measure/b.py": "", "autotune/record/summary.py": "", "autotune/errors.py": "",
              "autotune/output/export.py": "", "autotune/config/schema.py": "",
              "autotune/run/plan.py": "", "autotune/engines/a.py": "", **files})
    bad = layer_violations(import_edges(tmp_path, ("autotune",)))
    assert {(e.source, e.target) for e in bad} == expected


def test_the_getattr_check_finds_a_reach_into_the_engine(tmp_path):
    _write(tmp_path, {"autotune/__init__.py": "", "autotune/measure/__init__.py": "",
                      "autotune/measure/x.py":
                          "def f(engine):\n    return getattr(engine, 'params')\n",
                      "autotune/measure/y.py": "def g(run):\n    return getattr(run, 'gens')\n"})
    assert engine_getattrs(tmp_path) == [str(Path("autotune/measure/x.py")) + ":2"]
