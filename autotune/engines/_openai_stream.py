"""A stdlib-only streaming client for OpenAI-compatible servers, and server-process helpers.

``stream_completion`` times one ``POST /v1/completions`` request the way vLLM's own
benchmark client does (ENGINE_KNOBS.md §3): ``"stream": true`` with
``"stream_options": {"include_usage": true}``, the SSE stream split on blank lines, ``:``
pings skipped, ``data: [DONE]`` ends it. Each data chunk with non-empty ``choices`` is an
output arrival (TTFT = the first one); token counts come from the final ``usage`` chunk,
never from the number of chunks (one chunk can carry several tokens under speculative
decoding). ``free_port`` and ``wait_healthy`` start servers safely; only 127.0.0.1 is used.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune._files import tail as log_tail
from autotune.errors import RequestRejected
from autotune.errors import ServerExited
from autotune.measure.types import Generation

__all__ = ["HOST", "RequestRejected", "ServerExited", "free_port", "stream_completion",
           "wait_healthy"]

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_healthy(
    url: str,
    timeout_s: float,
    proc: subprocess.Popen | None = None,
    log_path: str | Path | None = None,
    interval_s: float = 0.25,
) -> float:
    """Poll ``url`` until it answers HTTP 200; return the seconds it took.

    Args:
        url: the health URL, e.g. ``http://127.0.0.1:8000/health``.
        timeout_s: give up after this many seconds.
        proc: the server process; if it exits first, fail at once instead of waiting.
        log_path: the server's log file, whose tail goes into the error messages.
        interval_s: time between polls.

    Raises:
        ServerExited: the process exited before the server was healthy.
        TimeoutError: no HTTP 200 within ``timeout_s``.
    """
    t0 = time.monotonic()
    last = "no answer yet"
    while True:
        if proc is not None and proc.poll() is not None:
            raise ServerExited(
                f"the server exited with code {proc.returncode} before {url} answered",
                log_tail(log_path),
            )
        try:
            with urllib.request.urlopen(url, timeout=2.0) as resp:
                if resp.status == 200:
                    return time.monotonic() - t0
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
            last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
        if time.monotonic() - t0 > timeout_s:
            tail = log_tail(log_path)
            raise TimeoutError(
                f"{url} did not answer 200 within {timeout_s:g} s (last: {last})"
                + (f"\n--- server log tail ---\n{tail}" if tail else "")
            )
        time.sleep(interval_s)


def get_json(base_url: str, path: str, timeout_s: float = 10.0) -> Any:
    """GET ``base_url + path`` and decode the JSON body."""
    with urllib.request.urlopen(base_url.rstrip("/") + path, timeout=timeout_s) as resp:
        return json.loads(resp.read().decode("utf-8"))


def post_json(base_url: str, path: str, body: dict, timeout_s: float = 30.0) -> Any:
    """POST a JSON body to ``base_url + path`` and decode the JSON answer."""
    req = urllib.request.Request(
        base_url.rstrip("/") + path, data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read().decode("utf-8"))


def served_model(base_url: str) -> str | None:
    """The first model id listed by ``GET /v1/models`` (None if there is none)."""
    data = get_json(base_url, "/v1/models").get("data") or []
    return data[0].get("id") if data else None


def iter_sse(lines: Iterator[bytes]) -> Iterator[str]:
    """Yield the data payload of each SSE event; stops after ``[DONE]``.

    Events are separated by blank lines; lines starting with ``:`` are comments (pings);
    several ``data:`` lines in one event are joined with newlines, as the SSE spec says.
    """
    data: list[str] = []
    for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                payload = "\n".join(data)
                data = []
                if payload.strip() == "[DONE]":
                    return
                yield payload
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data and "\n".join(data).strip() != "[DONE]":
        yield "\n".join(data)


def _is_output_chunk(choices: list[dict]) -> bool:
    """A chunk is an output arrival if it has choices, unless it only closes the stream.

    llama-cpp-python's server sends a last chunk with empty text and a finish_reason;
    counting it would put a token-less arrival at the end of every request.
    """
    if not choices:
        return False
    return any(c.get("text") or not c.get("finish_reason") for c in choices)


def stream_completion(
    base_url: str,
    prompt: str,
    max_tokens: int,
    *,
    model: str | None = None,
    ignore_eos: bool = True,
    timeout_s: float = 600.0,
    extra: dict | None = None,
    count_tokens: Callable[[str], int] | None = None,
) -> tuple[Generation, dict]:
    """Stream one greedy completion and time it.

    Args:
        base_url: ``http://127.0.0.1:PORT``.
        prompt: the prompt text.
        max_tokens: new tokens to generate.
        model: the ``model`` field of the request (omitted if None).
        ignore_eos: ask for exactly ``max_tokens`` (sends ``ignore_eos`` and ``min_tokens``).
        timeout_s: socket timeout of the request.
        extra: more request fields (they override the defaults).
        count_tokens: counts tokens of a text through the server (for servers that send no
            ``usage`` chunk); used for the prompt, and for the output only when the stream
            did not end on ``finish_reason == "length"``.

    Returns:
        (Generation, details) where details holds ``token_count_source`` (``usage``,
        ``length`` or ``count_tokens``), ``finish_reason`` and ``chunks``.

    Raises:
        RequestRejected: the server answered with an HTTP error.
        RuntimeError: the server sent no usage and the output length cannot be known.
    """
    host, _, port = base_url.removeprefix("http://").rstrip("/").partition(":")
    if host != HOST:
        raise ValueError(f"only {HOST} servers are measured; got {base_url!r}")
    body: dict[str, Any] = {
        "prompt": prompt, "max_tokens": int(max_tokens), "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model:
        body["model"] = model
    if ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = int(max_tokens)
    body.update(extra or {})
    payload = json.dumps(body).encode()
    conn = http.client.HTTPConnection(HOST, int(port or 80), timeout=timeout_s)
    times: list[float] = []
    texts: list[str] = []
    usage: dict = {}
    finish = None
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body=payload, headers={
            "Content-Type": "application/json", "Accept": "text/event-stream",
        })
        resp = conn.getresponse()
        if resp.status != 200:
            raise RequestRejected(resp.status, resp.read().decode("utf-8", "replace"))
        for data in iter_sse(iter(resp.readline, b"")):
            now = time.perf_counter() - t0
            chunk = json.loads(data)
            if "error" in chunk and not chunk.get("choices"):
                raise RequestRejected(500, json.dumps(chunk["error"]))
            choices = chunk.get("choices") or []
            if _is_output_chunk(choices):
                times.append(now)
                texts.append("".join(c.get("text") or "" for c in choices))
            for c in choices:
                finish = c.get("finish_reason") or finish
            if chunk.get("usage"):
                usage = chunk["usage"]
        e2e = time.perf_counter() - t0
    finally:
        conn.close()
    text = "".join(texts)
    if usage.get("completion_tokens") is not None:
        out_tokens, source = int(usage["completion_tokens"]), "usage"
    elif finish == "length":
        out_tokens, source = int(max_tokens), "length"
    elif count_tokens is not None:
        out_tokens, source = count_tokens(text), "count_tokens"
    else:
        raise RuntimeError(
            "the server sent no usage chunk and the stream ended with finish_reason="
            f"{finish!r}, so the output token count is unknown; use a server that honours "
            "stream_options.include_usage or configure a token-count endpoint"
        )
    if usage.get("prompt_tokens") is not None:
        prompt_tokens = int(usage["prompt_tokens"])
    else:
        prompt_tokens = count_tokens(prompt) if count_tokens is not None else 0
    gen = Generation(prompt_tokens, out_tokens, times, e2e, text)
    return gen, {"token_count_source": source, "finish_reason": finish, "chunks": len(times)}
