"""User-facing errors: one line, the key, the value, what is allowed (exit code 2)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(Exception):
    """A bad configuration, detected before any trial starts.

    The message is a single line that names the config path, the value received and what
    is allowed, with a "did you mean" suggestion for names. The CLI prints it and exits 2.
    """

    def __init__(self, path: str, value: object, allowed: str, hint: str = "") -> None:
        self.path = path
        self.value = value
        self.allowed = allowed
        self.hint = hint
        msg = f"{path}: got {value!r}; {allowed}"
        if hint:
            msg += f". {hint}"
        super().__init__(msg)


def did_you_mean(name: str, options: Iterable[str]) -> str:
    """Return 'Did you mean: x?' for the closest option, or '' if nothing is close."""
    close = difflib.get_close_matches(str(name), list(options), n=1, cutoff=0.6)
    return f"Did you mean: {close[0]}?" if close else ""


def unknown_name(path: str, name: str, options: Iterable[str], what: str = "name") -> ConfigError:
    """ConfigError for an unknown name, listing what is available and the closest match."""
    options = sorted(options)
    return ConfigError(
        path, name, f"unknown {what}; available: {', '.join(options)}", did_you_mean(name, options)
    )
