"""A FAKE TabbyAPI for the tests of the ``tabbyapi`` engine (TabbyAPI itself needs a CUDA GPU).

It starts the way TabbyAPI's ``main.py`` does: it reads ``config.yml`` from its working
directory, validates it against the copy of the config model of the branch its
``model.backend`` names (:func:`autotune.engines.tabbyapi.check.validate`), "loads" the model
``model_dir/model_name`` and only then listens on ``network.host:network.port``. It fails as
TabbyAPI does, with a traceback-like line in its log and exit code 1:

- a config its branch refuses: ``pydantic_core._pydantic_core.ValidationError: ...``;
- a model directory that does not exist: ``FileNotFoundError: ...`` at load;
- out of GPU memory: when ``model.cache_size`` (else ``max_seq_len``) is above the
  ``fake_max_tokens`` of the model's ``config.json``, ``torch.OutOfMemoryError: CUDA out of
  memory`` at load.

Served: ``GET /health``, ``GET /v1/models``, ``GET /v1/model`` and ``POST /v1/completions``
with ``stream: true`` (one SSE chunk per token, the ``usage`` chunk when
``stream_options.include_usage``, then ``data: [DONE]``); a key is required unless
``network.disable_auth``. A token takes ``fake_token_ms`` ms (config.json, default 2).
"""

from __future__ import annotations

import json
import sys
import time
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer
from pathlib import Path

import yaml

from autotune.engines.tabbyapi.check import branch_of
from autotune.engines.tabbyapi.check import validate


def load() -> tuple[dict, dict]:
    """(config.yml, the model's config.json), failing as TabbyAPI fails."""
    config = yaml.safe_load(Path("config.yml").read_text()) or {}
    problems = validate(config)
    if problems:
        print(f"pydantic_core._pydantic_core.ValidationError: {len(problems)} validation errors "
              f"for TabbyConfigModel ({branch_of(config)} branch)", flush=True)
        print("\n".join(problems), flush=True)
        sys.exit(1)
    model = config.get("model") or {}
    path = Path(model.get("model_dir", "models")) / str(model.get("model_name"))
    if not (path / "config.json").is_file():
        print(f"FileNotFoundError: Model path {path} does not exist or has no config.json", flush=True)
        sys.exit(1)
    card = json.loads((path / "config.json").read_text())
    tokens = model.get("cache_size") or model.get("max_seq_len") or 4096
    if tokens > int(card.get("fake_max_tokens", 1 << 30)):
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
              "a total capacity of 24.00 GiB of which 1.10 GiB is free.", flush=True)
        sys.exit(1)
    print(f"Model successfully loaded: {path.name} ({branch_of(config)} branch)", flush=True)
    return config, card


class Handler(BaseHTTPRequestHandler):
    config: dict = {}
    card: dict = {}

    def log_message(self, fmt: str, *args) -> None:  # quiet: TabbyAPI logs little per request
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _name(self) -> str:
        return str((self.config.get("model") or {}).get("model_name"))

    def do_GET(self) -> None:  # noqa: N802 - http.server's spelling
        if self.path == "/health":
            self._json(200, {"status": "healthy", "issues": []})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self._name(), "object": "model"}]})
        elif self.path == "/v1/model":
            self._json(200, {"id": self._name(), "parameters": self.config.get("model")})
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/v1/completions":
            return self._json(404, {"detail": "Not Found"})
        auth = (self.config.get("network") or {}).get("disable_auth")
        if not auth and not (self.headers.get("Authorization") or self.headers.get("x-api-key")):
            return self._json(401, {"detail": "Please provide an API key"})
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        n = int(body.get("max_tokens") or 16)
        prompt_tokens = max(1, len(str(body.get("prompt", "")).split()))
        delay = float(self.card.get("fake_token_ms", 2)) / 1000
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(n):
            time.sleep(delay)
            chunk = {"id": "cmpl-fake", "object": "text_completion", "model": self._name(),
                     "choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                     "total_tokens": prompt_tokens + n}
            self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def main() -> None:
    config, card = load()
    Handler.config, Handler.card = config, card
    net = config.get("network") or {}
    server = ThreadingHTTPServer((net.get("host", "127.0.0.1"), int(net.get("port", 5000))), Handler)
    print(f"Uvicorn running on http://{server.server_address[0]}:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
