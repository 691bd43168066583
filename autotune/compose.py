"""Compose a preset with Hydra: ``conf=NAME`` picks ``conf/NAME.yaml`` as the primary config.

``--config-dir DIR`` puts a user directory of presets in front of the project's ``conf/``
(its presets may use the project's engine/ and workload/ groups). ``version_base="1.3"``
always, and the working directory never changes.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

from autotune.engines.base import cpu_count
from autotune.errors import ConfigError
from autotune.errors import unknown_name

DEFAULT_PRESET = "local_cpu"


def project_conf_dir() -> Path:
    """The project's conf/ (repo checkout) or ./conf as a fallback."""
    here = Path(__file__).resolve().parents[1] / "conf"
    return here if here.is_dir() else Path.cwd() / "conf"


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


def compose(overrides: list[str], config_dir: str | None = None) -> dict:
    """Compose ``conf=NAME`` + overrides into a plain, resolved dict."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

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
    search = [f"file://{d}" for d in dirs if d != primary]
    if search:
        rest.append(f"hydra.searchpath=[{','.join(search)}]")
    try:
        with initialize_config_dir(config_dir=str(primary), version_base="1.3", job_name="autotune"):
            cfg = hydra_compose(config_name=preset, overrides=rest)
        data = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as e:
        msg = " ".join(str(e).split())
        raise ConfigError("overrides", " ".join(rest) or preset, msg) from None
    data.pop("hydra", None)
    return data
