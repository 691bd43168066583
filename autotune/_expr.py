"""Safe expressions over parameters: the small Python subset rules, ``when`` and ``predict`` use.

Comparisons, and/or/not, arithmetic, ``in``, literals, indexing such as ``gpu_split[0]`` and
``len/min/max/sum/abs``. Names must be known; an unknown name fails at load with a suggestion.
A name whose value is ``None`` (an inactive parameter) makes :meth:`Expr.applies` false.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from autotune.errors import ConfigError
from autotune.errors import unknown_name

EVAL_ERRORS = (TypeError, ValueError, ZeroDivisionError, IndexError, KeyError)
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
        except EVAL_ERRORS:
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
