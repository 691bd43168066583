"""Load-time checks of what a config points at: prompt sets, texts, paths, stores, context.

Everything here runs before anything is written and raises a one-line
:class:`~autotune.errors.ConfigError` (exit 2):

- ``workload.prompts`` is a shipped prompt set or a readable, non-empty ``.jsonl``/``.txt``;
- ``quality.text`` (when quality is on) is a shipped text or a readable, non-empty file;
- ``tracking.uri`` uses a scheme MLflow accepts (``file:`` and bare paths only with
  ``MLFLOW_ALLOW_FILE_STORE=true``, as MLflow 3 requires), ``study.storage`` one Optuna
  (SQLAlchemy) accepts, and every directory autotune would create can be created;
- ``workload.max_tokens`` plus the longest prompt fits the context the space allows.
  Prompt length is a lower bound (UTF-8 bytes / 8: real tokenizers give 4-6 bytes per
  token on prose), so no configuration is excluded that could have fitted. When no value
  of the engine's context knob (``Engine.context_knob_for``: ``n_ctx``, ``max_seq_len``,
  ``max_model_len``...) can hold it, the config is refused; when only some values are too
  small, :func:`context_rule` returns a rule that excludes them with the reason (a
  categorical value it always excludes is then refused at load by the space's
  reachability check, like any value no rule lets run).
- :func:`validate_model_paths` (real runs only, so ``--dry-run`` of a GPU preset works
  anywhere): every ``engine.variants.*.path`` exists and is readable.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.errors import did_you_mean
from autotune.errors import unknown_name
from autotune.measure.prompts import load_prompts
from autotune.measure.prompts import prompt_sets
from autotune.measure.spec import WorkloadSpec
from autotune.registry import get_engine_class

BYTES_PER_TOKEN_MAX = 8  # a tokenizer never averages more bytes per token than this on text
MLFLOW_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks",
                  "databricks-uc", "uc", "file")
DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "oracle")


def _scheme(uri: str) -> str:
    return uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""


def validate_creatable(path: str, what: str, value: Any = None) -> None:
    """``path`` is an existing directory, or one that can be created (nearest ancestor writable)."""
    p = Path(os.path.expanduser(path)).absolute()
    shown = value if value is not None else path
    if p.exists():
        if not p.is_dir():
            raise ConfigError(what, shown, f"{p} exists and is not a directory")
        if not os.access(p, os.W_OK | os.X_OK):
            raise ConfigError(what, shown, f"directory {p} is not writable")
        return
    parent = p.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(what, shown, f"cannot create {p}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(what, shown, f"cannot create {p}: {parent} is not a writable directory")


def _readable_file(path: Path, key: str, value: str) -> None:
    if not path.exists():
        raise ConfigError(key, value, f"no such file: {path}")
    if not path.is_file():
        raise ConfigError(key, value, f"{path} is not a file")
    if not os.access(path, os.R_OK):
        raise ConfigError(key, value, f"{path} is not readable")


def prompt_reasons(name: str) -> list[str]:
    """The workload's prompts (a shipped set or a file); a bad name or file is a ConfigError."""
    path = Path(name)
    if not path.suffix:
        if name not in prompt_sets():
            raise unknown_name("workload.prompts", name, prompt_sets(),
                               "prompt set (or give a path to a .jsonl / .txt file); sets")
    else:
        if path.suffix not in (".jsonl", ".txt"):
            raise ConfigError("workload.prompts", name, "expected a shipped set name or a "
                              ".jsonl ({\"prompt\": ...} per line) or .txt file")
        _readable_file(path, "workload.prompts", name)
    try:
        prompts = load_prompts(name)
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        why = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        raise ConfigError("workload.prompts", name, f"cannot read the prompts ({why}); a .jsonl "
                          "file needs one {\"prompt\": \"...\"} object per line") from None
    if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise ConfigError("workload.prompts", name, "holds no prompts (or an empty one)")
    return prompts


def validate_quality_text(enabled: bool, text: str) -> None:
    """The quality text exists, is readable and not empty (only when quality is on)."""
    if not enabled:
        return
    path = Path(text)
    if not path.suffix:
        root = resources.files("autotune") / "data" / "quality"
        shipped = sorted(p.name.removesuffix(".txt") for p in root.iterdir() if p.name.endswith(".txt"))
        if text not in shipped:
            raise unknown_name("quality.text", text, shipped,
                               "quality text (or give a path to a text file); texts")
        return
    _readable_file(path, "quality.text", text)
    try:
        body = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("quality.text", text, f"cannot read it as UTF-8 text: {e}") from None
    if not body.strip():
        raise ConfigError("quality.text", text, "the file is empty")


def validate_tracking(uri: str, artifacts: str | None) -> None:
    """The MLflow tracking URI is one MLflow accepts; its SQLite/artifact dirs can be made."""
    scheme = _scheme(uri)
    allowed = "sqlite:///PATH, postgresql://, mysql://, mssql://, http(s)://, databricks"
    if not uri.strip():
        raise ConfigError("tracking.uri", uri, f"expected a URI: {allowed}")
    file_store = scheme == "file" or (not scheme and ":" not in uri.split("/", 1)[0])
    if uri == "databricks" or (not scheme and not file_store):
        if uri != "databricks":
            raise ConfigError("tracking.uri", uri, f"not a URI (no '://'); expected {allowed}")
    elif file_store:
        if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
            raise ConfigError("tracking.uri", uri, "MLflow 3 refuses the file store unless "
                              f"MLFLOW_ALLOW_FILE_STORE=true; use {allowed}",
                              "Did you mean: sqlite:///mlruns/mlflow.db?")
        validate_creatable(uri.split("://", 1)[-1], "tracking.uri", uri)
    elif scheme not in MLFLOW_SCHEMES:
        shown = scheme or uri.split(":", 1)[0]
        hint = did_you_mean(shown, MLFLOW_SCHEMES)
        raise ConfigError("tracking.uri", uri, f"unsupported scheme {shown!r}; expected {allowed}",
                          hint)
    elif scheme == "sqlite":
        if not uri.startswith("sqlite:///") or len(uri) <= len("sqlite:///"):
            raise ConfigError("tracking.uri", uri, "expected sqlite:///relative/path.db or "
                              "sqlite:////absolute/path.db")
        _check_db_file(uri[len("sqlite:///"):], "tracking.uri", uri)
    if artifacts and "://" not in artifacts:
        validate_creatable(artifacts, "tracking.artifacts")


def _check_db_file(path: str, key: str, uri: str) -> None:
    p = Path(path).absolute()
    if p.exists() and (not p.is_file() or not os.access(p, os.R_OK | os.W_OK)):
        raise ConfigError(key, uri, f"{p} is not a readable and writable file")
    validate_creatable(str(p.parent), key, uri)


def validate_storage(study_dir: str, url: str | None) -> None:
    """``study.storage`` is an SQLAlchemy URL Optuna can open; ``study.dir`` can be created."""
    validate_creatable(study_dir, "study.dir")
    if url is None:
        return
    scheme = _scheme(url)
    if scheme not in DB_SCHEMES:
        raise ConfigError("study.storage", url, "expected an SQLAlchemy URL: sqlite:///PATH, "
                          "postgresql://..., mysql://... (or null for <study.dir>/optuna.db)",
                          did_you_mean(scheme or url.split(":", 1)[0], DB_SCHEMES))
    if scheme == "sqlite":
        if not url.startswith("sqlite:///") or len(url) <= len("sqlite:///"):
            raise ConfigError("study.storage", url, "expected sqlite:///PATH")
        _check_db_file(url[len("sqlite:///"):], "study.storage", url)


def prompt_tokens_low(prompts: list[str]) -> int:
    """A lower bound on the longest prompt's token count (+1 for the BOS token)."""
    return max(math.ceil(len(p.encode("utf-8")) / BYTES_PER_TOKEN_MAX) for p in prompts) + 1


def _context_values(spec: Any) -> list[float] | None:
    """The values a raw space spec allows for the context knob (None: unknown shape)."""
    if not isinstance(spec, dict):
        return None
    kind = spec.get("type")
    vals: Any = None
    if kind == "categorical":
        vals = spec.get("choices")
    elif kind in ("int", "float"):
        vals = [spec.get("low"), spec.get("high")]
    elif kind == "fixed":
        vals = [spec.get("value")]
    if not isinstance(vals, list) or not vals:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        return None
    return [float(v) for v in vals]


def context_rule(data: dict, wl: WorkloadSpec, prompts: list[str]) -> dict | None:
    """A rule excluding context sizes too small for the workload, or None if all fit.

    Raises ConfigError when no context the space allows can hold the longest prompt plus
    ``max_tokens``. A context of 0 or null means "the model's own" and is never excluded.
    """
    engine = data.get("engine") or {}
    try:
        cls = get_engine_class(engine.get("kind", "llamacpp"))
    except Exception:  # noqa: BLE001 - an unknown engine is reported by compile_space
        return None
    settings = engine.get("settings") if isinstance(engine.get("settings"), dict) else {}
    knob = cls.context_knob_for(settings)
    if knob is None:
        return None
    need, what = _tokens_needed(wl, prompts)
    if need is None:
        return None
    space = data.get("space") if isinstance(data.get("space"), dict) else {}
    if knob in space:
        values = _context_values(space[knob])
        where = f"space.{knob}"
    else:
        try:
            default = cls.default_params(engine.get("settings") or {}, engine.get("variants") or {})
        except Exception:  # noqa: BLE001 - bad settings are reported by compile_space
            return None
        value = default.get(knob)
        values = [float(value)] if isinstance(value, (int, float)) else None
        where = f"the engine default {knob}"
    if not values or any(v <= 0 for v in values):
        return None
    biggest = max(values)
    if need > biggest:
        key, value = ("workload.mix", [asdict(m) for m in wl.mix]) if wl.mix else \
            ("workload.max_tokens", wl.max_tokens)
        raise ConfigError(key, value, f"{what} needs a context of at least {need} tokens, but "
                          f"{where} allows at most {biggest:g}; lower the lengths or allow a "
                          f"larger {knob}")
    if min(values) >= need:
        return None
    return {"require": f"{knob} >= {need}",
            "reason": f"{knob} < {need}: too small for {what}"}


def _tokens_needed(wl: WorkloadSpec, prompts: list[str]) -> tuple[int | None, str]:
    """(a lower bound on the context one request needs, what it is made of).

    A mixed workload needs its longest class; a conversation at least its first turn; a
    context ladder adapts to the trial's context, so it needs nothing fixed (None).
    """
    if wl.context_ladder:
        return None, ""
    if wl.mix:
        big = max(wl.mix, key=lambda m: m.prompt_tokens + m.output_tokens)
        return (big.prompt_tokens + big.output_tokens,
                f"the workload's longest class ({big.prompt_tokens} prompt + "
                f"{big.output_tokens} output tokens)")
    low = prompt_tokens_low(prompts)
    return (low + wl.max_tokens, f"the longest prompt of '{wl.prompts}' (at least {low} tokens) "
            f"+ max_tokens {wl.max_tokens}")


def validate_model_paths(variants: dict) -> None:
    """Every variant's ``path`` exists and is readable (a file or a model directory)."""
    for name, v in variants.items():
        path = v.get("path") if isinstance(v, dict) else None
        if not isinstance(path, str):
            continue
        key = f"engine.variants.{name}.path"
        p = Path(path)
        if not p.exists():
            raise ConfigError(key, path, "no such file or directory")
        if not os.access(p, os.R_OK) or (p.is_dir() and not os.access(p, os.X_OK)):
            raise ConfigError(key, path, "not readable")


def validate_energy_counter(objectives: list[str], constraints: list[str]) -> None:
    """``energy_j_per_token`` as an objective or constraint needs an energy counter here
    (:func:`autotune.measure.energy.find_counters`); call it for a local Ray only, since a
    cluster's nodes may have counters this machine lacks."""
    for key, names in (("objectives", objectives), ("constraints", constraints)):
        if "energy_j_per_token" in names:
            from autotune.measure.energy import find_counters

            counters, why = find_counters()
            if not counters:
                raise ConfigError(key, "energy_j_per_token", f"{why}; drop it or run where one is")
            return
