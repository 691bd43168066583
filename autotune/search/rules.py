"""Safe expressions over trial parameters: rules (``n_ubatch <= n_batch``) and ``when`` conditions.

Expressions use a small subset of Python (comparisons, and/or/not, arithmetic, ``in``,
literals, indexing such as ``gpu_split[0]``, ``len/min/max/sum/abs``). Names must be parameters of the space; an unknown
name fails at load with a suggestion. A parameter that is inactive (its ``when`` is false)
is ``None``; a rule that mentions an inactive parameter does not apply.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from autotune._expr import EVAL_ERRORS
from autotune._expr import Expr
from autotune._expr import compile_expr
from autotune.errors import ConfigError
from autotune.errors import unknown_name

__all__ = ["Expr", "Rule", "compile_expr", "compile_rule", "violations"]


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
        except EVAL_ERRORS:
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
