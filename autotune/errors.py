"""Every exception autotune raises on purpose, under one :class:`AutotuneError` base.

- :class:`ConfigError`: bad user input, found before any trial starts (one line, exit 2).
- :class:`InfeasibleConfig`: a trial's parameters cannot run (recorded as infeasible).
- :class:`Unsupported`: an optional engine capability is missing (e.g. full logits).
- :class:`CommandFailed`, :class:`ServerExited`, :class:`RequestRejected`: an engine's
  process failed; the trial worker turns each into a failed result with its reason.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class AutotuneError(Exception):
    """Base of every exception autotune raises on purpose."""


class ConfigError(AutotuneError):
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


class InfeasibleConfig(AutotuneError):
    """Raised by an engine when the trial's parameters cannot run (recorded as infeasible)."""


class Unsupported(AutotuneError, RuntimeError):
    """An optional capability the engine does not have (e.g. full logits for quality)."""


class CommandFailed(AutotuneError):
    """A command engine's command exited non-zero, printed no metrics line, or timed out."""


class ServerExited(AutotuneError, RuntimeError):
    """The server process exited before it answered its health check."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message + (f"\n--- server log tail ---\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail


class RequestRejected(AutotuneError, RuntimeError):
    """The server answered a completion request with an HTTP error status."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"POST /v1/completions returned HTTP {status}: {body[:1000]}")
        self.status = status
        self.body = body


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
