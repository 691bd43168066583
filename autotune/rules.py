"""Safe expressions over trial parameters: rules (``n_ubatch <= n_batch``) and ``when`` conditions.

Expressions use a small subset of Python (comparisons, and/or/not, arithmetic, ``in``,
literals, indexing such as ``gpu_split[0]``, ``len/min/max/sum/abs``). Names must be parameters of the space; an unknown
name fails at load with a suggestion. A parameter that is inactive (its ``when`` is false)
is ``None``; a rule that mentions an inactive parameter does not apply.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from autotune.errors import ConfigError
from autotune.errors import unknown_name

_EVAL_ERRORS = (TypeError, ValueError, ZeroDivisionError, IndexError, KeyError)
_FUNCS = {"len": len, "min": min, "max": max, "sum": sum, "abs": abs}
_ALLOWED = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
    ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Compare,
    ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Name,
    ast.Load, ast.Constant, ast.List, ast.Tuple, ast.Call, ast.IfExp, ast.Subscript, ast.Slice,
)


@dataclass(frozen=True)
class Expr:
    """A compiled, validated expression and the parameter names it reads."""

    text: str
    names: frozenset[str]
    code: Any

    def __call__(self, params: dict[str, Any]) -> Any:
        env = {n: params.get(n) for n in self.names}
        return eval(self.code, {"__builtins__": {}, **_FUNCS}, env)  # noqa: S307 (AST-checked)

    def applies(self, params: dict[str, Any]) -> bool:
        """False if any name it reads is inactive (None) in ``params``."""
        return all(params.get(n) is not None for n in self.names)

    def holds(self, params: dict[str, Any]) -> bool:
        """True if every name is active and the expression is truthy (an error is False)."""
        if not self.applies(params):
            return False
        try:
            return bool(self(params))
        except _EVAL_ERRORS:
            return False


def compile_expr(text: Any, known: Iterable[str], path: str) -> Expr:
    """Parse and check an expression; names must be in ``known``."""
    known = set(known)
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(path, text, "expected an expression string such as 'n_ubatch <= n_batch'")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ConfigError(path, text, f"not a valid expression ({e.msg})") from None
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ConfigError(
                path, text, f"'{type(node).__name__}' is not allowed; use comparisons, "
                "and/or/not, arithmetic, 'in', indexing and len/min/max/sum/abs"
            )
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS:
                raise ConfigError(path, text, f"only {', '.join(_FUNCS)} may be called")
        elif isinstance(node, ast.Name) and node.id not in _FUNCS:
            if node.id not in known:
                raise unknown_name(path, node.id, known, "parameter")
            names.add(node.id)
    return Expr(text.strip(), frozenset(names), compile(tree, path, "eval"))


@dataclass(frozen=True)
class Rule:
    """``require`` must hold whenever ``when`` holds (and every name it reads is active)."""

    require: Expr
    when: Expr | None
    reason: str
    path: str

    def violated(self, params: dict[str, Any]) -> bool:
        if self.when is not None and not self.when.holds(params):
            return False
        if not self.require.applies(params):
            return False
        try:
            return not bool(self.require(params))
        except _EVAL_ERRORS:
            return True


def compile_rule(item: Any, known: Iterable[str], path: str) -> Rule:
    """A rule is ``"EXPR"`` or ``{require: EXPR, when: EXPR, reason: TEXT}``."""
    known = list(known)
    if isinstance(item, str):
        return Rule(compile_expr(item, known, path), None, item.strip(), path)
    if isinstance(item, dict):
        extra = set(item) - {"require", "when", "reason"}
        if extra:
            key = sorted(extra)[0]
            raise unknown_name(f"{path}.{key}", key, ["require", "when", "reason"], "key")
        if "require" not in item:
            raise ConfigError(path, item, "a rule mapping needs 'require: EXPR' (and optional when, reason)")
        require = compile_expr(item["require"], known, f"{path}.require")
        when = compile_expr(item["when"], known, f"{path}.when") if "when" in item else None
        reason = str(item.get("reason") or (f"{require.text} when {when.text}" if when else require.text))
        return Rule(require, when, reason, path)
    raise ConfigError(path, item, "expected 'EXPR' or {require: EXPR, when: EXPR, reason: TEXT}")


def violations(rules: Iterable[Rule], params: dict[str, Any]) -> list[str]:
    """Reasons of the rules that ``params`` break (empty if all hold)."""
    return [r.reason for r in rules if r.violated(params)]
