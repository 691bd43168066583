"""The config file of a server engine, rendered from a trial's knobs (``settings.config_file``).

``{path: config.yml, format: yaml | json, template: {...}}``: the template is any YAML/JSON
structure. A string that is exactly one placeholder (``"{cache_mode}"``) takes the value
itself, typed (an int stays an int, a list a list, None null); any other string is filled as
text by the argv renderer (:func:`autotune.engines._argv.render_item`). Keys are never
templated, and nothing goes through a shell. Used by ``openai_server`` (and so by any server
that reads a config file: TabbyAPI's ``config.yml``, ``vllm serve --config``, SGLang).
"""

from __future__ import annotations

import re
from typing import Any

from autotune.engines._argv import placeholders
from autotune.engines._argv import render_item
from autotune.errors import ConfigError
from autotune.errors import unknown_name

CONFIG_FORMATS = ("yaml", "json")


def check_config_file(spec: Any, path: str) -> None:
    """``settings.config_file`` is ``{path: NAME, format: yaml|json, template: {...}}``."""
    if not isinstance(spec, dict):
        raise ConfigError(path, spec, "expected {path: config.yml, format: yaml|json, template: {...}}")
    for key in spec:
        if key not in ("path", "format", "template"):
            raise unknown_name(f"{path}.{key}", key, ["path", "format", "template"], "config_file key")
    name = spec.get("path")
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise ConfigError(f"{path}.path", name, "a file name in the trial's workdir, e.g. config.yml")
    if spec.get("format", "yaml") not in CONFIG_FORMATS:
        raise unknown_name(f"{path}.format", spec.get("format"), CONFIG_FORMATS, "config format")
    if not isinstance(spec.get("template"), (dict, list)):
        raise ConfigError(f"{path}.template", spec.get("template"), "a mapping (or list): the document")


def render_document(template: Any, values: dict[str, Any], path: str) -> Any:
    """Fill a config document: ``"{name}"`` alone takes the value, other strings are text.

    Raises ConfigError for a malformed placeholder or one that names no value.
    """
    if isinstance(template, dict):
        return {k: render_document(v, values, f"{path}.{k}") for k, v in template.items()}
    if isinstance(template, list):
        return [render_document(v, values, f"{path}[{i}]") for i, v in enumerate(template)]
    if not isinstance(template, str):
        return template
    try:
        fields = placeholders(template)
    except ValueError as e:
        raise ConfigError(path, template, f"malformed placeholder ({e}); write {{{{ for a brace") from None
    for name, _spec in fields:
        if name not in values:
            raise unknown_name(path, f"{{{name}}}", [f"{{{v}}}" for v in values], "placeholder")
    whole = re.fullmatch(r"\{(\w+)\}", template)
    if whole:
        return values[whole.group(1)]
    return render_item(template, values)
