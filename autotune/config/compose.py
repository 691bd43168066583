"""Compose a preset with Hydra: ``conf=NAME`` picks ``conf/NAME.yaml`` as the primary config.

``--config-dir DIR`` puts a user directory of presets in front of the project's ``conf/``
(its presets may use the project's engine/ and workload/ groups). ``version_base="1.3"``
always, and the working directory never changes.

Hydra's own errors are translated into one-line :class:`ConfigError` messages that name the key:
``study.n_trial=3`` gives ``study.n_trial: got 'n_trial'; unknown key; available: ...
Did you mean: n_trials?``. Resolvers: ``${cpus:}`` (usable CPUs) and ``${project_dir:}``
(the autotune checkout, for paths to files shipped in the repo).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.errors import OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from autotune.errors import ConfigError
from autotune.errors import did_you_mean
from autotune.errors import unknown_name
from autotune.hardware import cpu_count

DEFAULT_PRESET = "local_cpu"
# Mappings whose keys are the user's own (a new key there may be added with +key=value).
FREE_FORM = ("space.", "engine.settings.", "engine.variants.", "quality.reference.", "select.weights.")


def project_conf_dir() -> Path:
    """The project's presets: ``conf/`` at a checkout's top level, ``autotune/conf`` in a wheel."""
    package = Path(__file__).resolve().parents[1]
    inside = package / "conf"
    return inside if inside.is_dir() else package.parent / "conf"


def project_dir() -> Path:
    """The directory that holds the ``autotune`` package: the checkout's root when run from one."""
    return Path(__file__).resolve().parents[2]


def presets(dirs: list[Path]) -> list[str]:
    """Preset names (top-level YAML files other than base) found in ``dirs``."""
    names = set()
    for d in dirs:
        if d.is_dir():
            names |= {p.stem for p in d.glob("*.yaml") if p.stem != "base"}
    return sorted(names)


def _register_resolvers() -> None:
    if not OmegaConf.has_resolver("cpus"):
        OmegaConf.register_new_resolver("cpus", lambda: cpu_count())
    if not OmegaConf.has_resolver("project_dir"):
        OmegaConf.register_new_resolver("project_dir", lambda: str(project_dir()))


def _parse_overrides(overrides: list[str]) -> list:
    """Hydra's parsed overrides; a syntax error names the override that has it."""
    parser = OverridesParser.create()
    out = []
    for o in overrides:
        try:
            out.extend(parser.parse_overrides([o]))
        except OverrideParseException as e:
            why = str(e).splitlines()
            why = next((w for w in why if w and not w.startswith(("Error parsing", "See "))), "")
            key = o.split("=", 1)[0].lstrip("+~") if "=" in o else o
            raise ConfigError(key, o, f"not a valid override ({why}); write key=value, and quote "
                              "values with spaces or brackets: key='[1, 2]'") from None
    return out


def _lookup(tree: object, key: str) -> tuple[str, str, object] | None:
    """The first component of dotted ``key`` missing in ``tree``: (path, name, parent)."""
    node, done = tree, []
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return ".".join([*done, part]), part, node
        node = node[part]
        done.append(part)
    return None


def _explain(err: Exception, compose_without, overrides: list[str], parsed: list) -> ConfigError | None:
    """A one-line ConfigError for a Hydra composition error, or None if not understood."""
    raw = str(err)
    text = " ".join(raw.split())
    by_key = {p.key_or_group: o for o, p in zip(overrides, parsed)}
    m = re.search(r"Could not (?:override|delete from config\.) '([^']+)'", text)
    if m:
        key = m.group(1)
        tree = compose_without(by_key.get(key))
        missing = _lookup(tree, key) if tree is not None else None
        if missing is None:
            return None
        path, name, parent = missing
        if not isinstance(parent, dict):
            parent_path = path.rpartition(".")[0]
            return ConfigError(parent_path, parent, f"is not a mapping, so it has no key {name!r}")
        options = [str(k) for k in parent]
        hint = did_you_mean(name, options)
        if not hint and path.startswith(FREE_FORM) and "Could not override" in text:
            hint = f"To add a new key, write +{key}=VALUE"
        shown = ", ".join(sorted(options)[:30]) or "(none)"
        return ConfigError(path, name, f"unknown key; available: {shown}", hint)
    m = re.search(r"An item is already at '([^']+)'", text)
    if m:
        key = m.group(1)
        return ConfigError(key, by_key.get(key, key), f"{key} already exists; drop the '+' "
                           f"({key}=VALUE) or write ++{key}=VALUE to add or override")
    m = re.search(r"Could not find '([^'/]+)/([^']+)'", text)
    if m:
        group, option = m.group(1), m.group(2)
        avail = re.search(rf"Available options in '{re.escape(group)}':\n((?:\t.*\n?)*)", raw)
        options = avail.group(1).split() if avail else []
        return unknown_name(group, option, options, f"option of config group {group}")
    m = re.search(r"primary config '([^']+)' must be a DictConfig, got (\w+)", text)
    if m:
        return ConfigError("conf", m.group(1), f"the preset is a {m.group(2)}; expected a mapping "
                           "of sections (defaults, study, engine, space, ...)")
    m = re.search(r"Interpolation key '([^']+)' not found full_key: (\S+)", text)
    if m:
        return ConfigError(m.group(2), f"${{{m.group(1)}}}", "interpolation key not found")
    return None


def compose(overrides: list[str], config_dir: str | None = None) -> dict:
    """Compose ``conf=NAME`` + overrides into a plain, resolved dict."""
    _register_resolvers()
    preset = DEFAULT_PRESET
    rest = []
    for o in overrides:
        if o.startswith("conf="):
            preset = o.split("=", 1)[1]
        else:
            rest.append(o)
    dirs = [project_conf_dir()]
    if config_dir:
        user = Path(os.path.expanduser(config_dir)).resolve()
        if not user.is_dir():
            raise ConfigError("--config-dir", config_dir, "expected an existing directory of presets")
        dirs.insert(0, user)
    if preset not in presets(dirs):
        raise unknown_name("conf", preset, presets(dirs), "preset")
    primary = next(d for d in dirs if (d / f"{preset}.yaml").exists())
    parsed = _parse_overrides(rest)
    search = [f"file://{d}" for d in dirs if d != primary]
    searchpath = [f"hydra.searchpath=[{','.join(search)}]"] if search else []

    def run(items: list[str]) -> dict:
        with initialize_config_dir(config_dir=str(primary), version_base="1.3", job_name="autotune"):
            cfg = hydra_compose(config_name=preset, overrides=items + searchpath)
        return OmegaConf.to_container(cfg, resolve=True)

    def compose_without(override: str | None) -> dict | None:
        try:
            return run([o for o in rest if o != override])
        except (HydraException, OmegaConfBaseException):
            return None

    try:
        data = run(rest)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        name = mark.name if mark else preset
        what = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError(name, where, f"not valid YAML: {what}") from None
    except (HydraException, OmegaConfBaseException) as e:
        nice = _explain(e, compose_without, rest, parsed)
        if nice is not None:
            raise nice from None
        msg = " ".join(str(e).split())
        raise ConfigError("overrides", " ".join(rest) or preset, msg) from None
    data.pop("hydra", None)
    return data
