"""Records at every edge: outside ``autotune/record/`` a study's summary and config are read by
attribute, never by string key, and Optuna's user attributes are touched in two modules: written
in ``record/optuna_study.py``, read in ``search/trials.py``.

The scan reads every module of ``autotune/`` with :mod:`ast`. In each function a value is a
*study record* when it comes from ``read_summary`` / ``read_config`` /
``StudySummary.load|from_dict`` / ``load_config`` or any ``.to_dict()``, when it is a parameter
annotated ``StudySummary``, ``Verdict`` or ``Config``, any name ``summary``, or when it is bound to an expression
rooted at such a value (``rem = summary.remeasured``). Reading one with a string constant
(``s["n_trials"]``, ``s.get("winner")``, ``(read_summary(p) or {}).get("winner")``,
``cfg.raw["select"]``) is a finding. Keys that are data (metric and parameter names in a
variable, ``win.metrics.get(k)``) are not string constants and stay allowed; so do copies of
``Config.raw`` taken to write a config file (``best.yaml``, ``config.yaml``), which are not
rooted at a record. The checker is itself tested on the patterns the code used before.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "autotune"
RECORD = ROOT / "record"
# Optuna's user attributes: written in record/optuna_study.py, read in search/trials.py (trial_attrs)
ATTRS_HOMES = (RECORD / "optuna_study.py", ROOT / "search" / "trials.py")
SOURCES = ("read_summary", "read_config", "load_config", "to_dict", "load", "from_dict")
ANNOTATED = re.compile(r"\b(StudySummary|Verdict|Config)\b")
NAMED = {"summary"}  # by convention this name holds a study's summary
ATTRS_API = {"user_attrs", "set_user_attr", "set_trial_user_attr", "set_system_attr"}
# Issue 21's storage repair and resume checks (written alongside issue 19) still touch study
# attributes directly; they are to call record.optuna_study's study_attr / set_study_attr /
# trial_attrs too, and then leave this list. Nothing outside autotune/record/ is exempt.


def _is_source(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    if name in ("load", "from_dict"):  # only the records' own constructors, not json.load
        return isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "StudySummary"
    return name in SOURCES


def _is_raw(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "raw"


class _Checker(ast.NodeVisitor):
    """Findings in one module: (line, source text) of each string-keyed read of a record."""

    def __init__(self) -> None:
        self.tainted: list[set[str]] = [set(NAMED)]
        self.found: list[tuple[int, str]] = []

    def _tainted(self, node: ast.AST) -> bool:
        base = node
        while isinstance(base, (ast.Attribute, ast.Subscript, ast.Call, ast.BoolOp)):
            if _is_source(base) or _is_raw(base):
                return True
            nxt = _root_step(base)
            if nxt is None:
                break
            base = nxt
        return isinstance(base, ast.Name) and base.id in self.tainted[-1] or _is_source(base)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        names = {a.arg for a in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]
                 if a.annotation is not None and ANNOTATED.search(ast.unparse(a.annotation))}
        self.tainted.append(names | NAMED)
        self.generic_visit(node)
        self.tainted.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        if self._tainted(node.value):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        self.tainted[-1].add(n.id)
        for t in node.targets:
            self.visit(t)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        key = node.slice
        if isinstance(node.ctx, ast.Load) and isinstance(key, ast.Constant) and isinstance(key.value, str) \
                and self._tainted(node.value):
            self.found.append((node.lineno, ast.unparse(node)))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "get" and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
                and self._tainted(f.value):
            self.found.append((node.lineno, ast.unparse(node)))
        self.generic_visit(node)


def _root_step(node: ast.AST) -> ast.AST | None:
    if isinstance(node, (ast.Attribute, ast.Subscript)):
        return node.value
    if isinstance(node, ast.Call):
        return node.func.value if isinstance(node.func, ast.Attribute) else None
    if isinstance(node, ast.BoolOp):
        return node.values[0]
    return None


def string_keyed_reads(source: str) -> list[tuple[int, str]]:
    """Every string-keyed read of a study record in ``source`` (see the module docstring)."""
    checker = _Checker()
    checker.visit(ast.parse(source))
    return checker.found


def _outside_record() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if RECORD not in p.parents)


BEFORE = {  # the reads the code did before the summary and config became records
    "report": "def render_summary(console, summary: dict, sel):\n    print(summary['n_trials'])\n",
    "report typed": "def render_summary(console, s: StudySummary, sel, files):\n    print(s['n_trials'])\n",
    "export": "def export_trial(path):\n    winner = (read_summary(path) or {}).get('winner')\n",
    "html": "def write_report(path):\n    summary = read_summary(path)\n    w = (summary or {}).get('winner')\n",
    "nested": "def f(summary: StudySummary):\n    rem = summary.remeasured\n    return rem['by_trial']\n",
    "config": "def state_of(path):\n    config = read_config(path)\n    return config['study']['name']\n",
    "config get": "def f(path):\n    return (read_config(path).get('select') or {}).get('metric')\n",
    "raw": "def f(cfg):\n    return cfg.raw['select']\n",
    "to_dict": "def f(s):\n    return s.to_dict()['winner']\n",
}
ALLOWED = {
    "attributes": "def f(path):\n    s = read_summary(path)\n    return s.winner.number, s.n_trials\n",
    "data keys": "def f(s: StudySummary, k):\n    return s.winner.metrics.get(k)\n",
    "writer copy": "def f(cfg):\n    data = copy.deepcopy(cfg.raw)\n    data['space'] = {}\n    return data\n",
    "json": "def f(p):\n    return json.load(p)['x']\n",
}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_checker_finds_the_reads_of_before(name):
    assert string_keyed_reads(BEFORE[name]), name


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_checker_allows_attribute_reads(name):
    assert string_keyed_reads(ALLOWED[name]) == [], name


def test_no_string_keyed_reads_of_summaries_or_configs_outside_record():
    found = [f"{p.relative_to(ROOT.parent)}:{line}: {text}" for p in _outside_record()
             for line, text in string_keyed_reads(p.read_text())]
    assert found == [], "read the record's attributes instead:\n" + "\n".join(found)


def test_optuna_user_attrs_only_in_record_study():
    found = []
    for p in sorted(ROOT.rglob("*.py")):
        if p in ATTRS_HOMES:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ATTRS_API:
                found.append(f"{p.relative_to(ROOT.parent)}:{node.lineno}: .{node.attr}")
    assert found == [], "write them through autotune.record.optuna_study, read them with autotune.search.trials.trial_attrs:\n" + "\n".join(found)
