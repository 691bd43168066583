"""The one argv-template renderer, shared by the ``command`` and ``openai_server`` engines.

A template is a list; each item is a string (or a number) formatted on its own with
``{name}`` / ``{name:spec}`` placeholders, or a *group*: a list of such strings that stays
together (``["--draft-k", "{draft_k}"]``). A group, or a lone item, is left out whole when a
placeholder it names has the value None (a knob without a value). Values render as literal
argv text (:func:`render_value`): ``true``/``false``, lists as ``a,b``, mappings as JSON;
``{name:spec}`` applies ``format(value, spec)`` to the raw value. Literal braces are ``{{``
and ``}}``. No shell is ever involved: an item is one argv entry whatever it contains.
"""

from __future__ import annotations

import json
import string
from typing import Any

from autotune.errors import ConfigError
from autotune.errors import unknown_name

_FORMATTER = string.Formatter()


def render_value(value: Any) -> str:
    """The literal argv text of a value: ``true``/``false``, ``a,b``, JSON, '' for None."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(render_value(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def placeholders(item: str) -> list[tuple[str, str]]:
    """``(name, spec)`` of each ``{name:spec}`` in ``item`` (ValueError if malformed).

    ``name`` is the root of the field: ``{a.b}`` and ``{a[0]}`` name ``a``.
    """
    return [(f.split(".")[0].split("[")[0], s or "")
            for _, f, s, _ in _FORMATTER.parse(item) if f is not None]


def render_item(item: str, values: dict[str, Any]) -> str:
    """Fill one template string; every placeholder must be a key of ``values``."""
    out = []
    for lit, field, spec, _conv in _FORMATTER.parse(item):
        out.append(lit)
        if field is not None:
            value, _ = _FORMATTER.get_field(field, (), values)
            out.append(format(value, spec) if spec else render_value(value))
    return "".join(out)


def render_argv(template: Any, values: dict[str, Any], path: str = "engine.settings.argv",
                drop_empty: bool = False) -> list[str]:
    """Fill an argv template item by item (see the module docstring).

    Args:
        template: the list of items and groups.
        values: placeholder name -> value (None leaves its item or group out).
        path: the config path named in errors.
        drop_empty: also leave out items that render to the empty string.

    Raises:
        ConfigError: the template is not a list, an item is not a string, a placeholder is
            malformed or names no key of ``values`` (with "did you mean").
    """
    if not isinstance(template, (list, tuple)) or not template:
        raise ConfigError(path, template, "expected a non-empty list of argv items (no shell string)")
    argv: list[str] = []
    for i, item in enumerate(template):
        group = item if isinstance(item, list) else [item]
        if isinstance(item, list) and not item:
            raise ConfigError(f"{path}[{i}]", item, "a group is a non-empty list of strings")
        names = set()
        for j, part in enumerate(group):
            ip = f"{path}[{i}]" + (f"[{j}]" if isinstance(item, list) else "")
            if isinstance(part, bool) or not isinstance(part, (str, int, float)):
                raise ConfigError(ip, part, "expected a string (or a group: a list of them)")
            try:
                fields = placeholders(str(part))
            except ValueError as e:
                raise ConfigError(ip, part, f"malformed placeholder ({e}); write {{{{ for a brace") from None
            for name, _spec in fields:
                if name not in values:
                    raise unknown_name(ip, f"{{{name}}}", [f"{{{v}}}" for v in values],
                                       "placeholder")
                names.add(name)
        if any(values[n] is None for n in names):
            continue  # a knob without a value: leave the item (or group) out
        for part in group:
            text = render_item(str(part), values)
            if text or not drop_empty:
                argv.append(text)
    return argv
