"""A toy layer-streaming decoder standing in for a custom engine (seed 001's C++ streamer).

Like the seed's engine it streams every layer's weights for every forward pass: the
weights live in "host RAM" as float16 and each pass dequantises a layer into a float32
staging buffer (the H2D copy of seed 001) before multiplying, so decoding is bound by the
stream, not by the arithmetic. It does that real CPU work, and its speed depends on two
knobs, so a tuner has a genuine optimum:

- ``--skip-threshold T``: a layer whose output has cosine similarity > T with its input
  (measured once on calibration tokens) is skipped. Skipping saves one weight read per
  token but costs quality: ``ppl_delta_pct`` grows with the skipped layers' (1 - cos).
- ``--draft-k K``: speculative decoding. A cheap resident draft (the first quarter of the
  layers, kept in float32) proposes K tokens; the full model verifies them in one batched
  pass (one stream of each layer for K + 1 rows). Each drafted token is accepted
  with a probability that falls with skipping, so large K wastes work and skipping plus
  speculation can cancel out, as seed 001 measured. K = 0 turns speculation off.

Prefill streams each layer once for all prompt rows. The last stdout line is one JSON
object with the metrics (``decode_tps``, ``ttft_p50_ms``, ``ttft_p95_ms``,
``ppl_delta_pct``, ``accept_rate``, ``skipped_layers``).

Fault switches for tests: ``--fault exit3`` (exits 3 with a message on stderr),
``--fault nojson`` (prints no metrics line), ``--fault hang`` (sleeps forever).

Usage: python bench/engines/toy_streamer.py --draft-k 4 --skip-threshold 0.97
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np


class Model:
    """Residual blocks ``x + s * tanh(x @ W)``; weights in float16, streamed per pass."""

    def __init__(self, layers: int, hidden: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.host = [
            (rng.standard_normal((hidden, hidden), dtype=np.float32) / math.sqrt(hidden)).astype(
                np.float16
            )
            for _ in range(layers)
        ]
        # A few layers matter a lot, most little (as in real LLMs' middle layers).
        scale = rng.uniform(0.03, 0.8, layers) ** 2
        scale[0] = 0.8
        self.scale = scale.astype(np.float32)
        self.stage = np.empty((hidden, hidden), dtype=np.float32)
        self.hidden = hidden

    def block(self, x: np.ndarray, w: np.ndarray, i: int) -> np.ndarray:
        y = x + self.scale[i] * np.tanh(x @ w)
        return y / np.linalg.norm(y, axis=-1, keepdims=True)

    def forward(self, x: np.ndarray, layers: list[int]) -> np.ndarray:
        """Stream each layer (dequantise into the staging buffer), then apply it."""
        for i in layers:
            np.copyto(self.stage, self.host[i])
            x = self.block(x, self.stage, i)
        return x

    def cosines(self, seed: int) -> np.ndarray:
        """Mean cosine similarity of each layer's input and output on calibration rows."""
        x = np.random.default_rng(seed + 1).standard_normal((32, self.hidden), dtype=np.float32)
        x /= np.linalg.norm(x, axis=-1, keepdims=True)
        cos = np.empty(len(self.host))
        for i in range(len(self.host)):
            y = self.forward(x, [i])
            cos[i] = float(np.mean(np.sum(x * y, axis=-1)))
            x = y
        return cos


class Draft:
    """A resident draft: the first layers of the model, kept dequantised (no stream)."""

    def __init__(self, model: Model, layers: list[int]) -> None:
        self.model = model
        self.layers = [(i, model.host[i].astype(np.float32)) for i in layers]

    def next(self, x: np.ndarray) -> np.ndarray:
        for i, w in self.layers:
            x = self.model.block(x, w, i)
        return x


def decode(
    args: argparse.Namespace,
    model: Model,
    active: list[int],
    draft: Draft,
    accept_p: float,
    rng: np.random.Generator,
) -> tuple[float, int, int, int]:
    """Generate ``args.tokens`` tokens; returns (seconds, tokens, drafted, accepted)."""
    x = rng.standard_normal((1, model.hidden), dtype=np.float32)
    x /= np.linalg.norm(x)
    produced = drafted = accepted = 0
    t0 = time.perf_counter()
    while produced < args.tokens:
        if args.draft_k <= 0:
            x = model.forward(x, active)
            produced += 1
            continue
        rows = [x]
        for _ in range(args.draft_k):  # the draft proposes K tokens one by one
            rows.append(draft.next(rows[-1]))
        out = model.forward(np.concatenate(rows, axis=0), active)  # verify K + 1 rows at once
        n_ok = 0
        while n_ok < args.draft_k and rng.random() < accept_p:
            n_ok += 1
        drafted += args.draft_k
        accepted += n_ok
        produced += n_ok + 1
        x = out[n_ok : n_ok + 1]
    return time.perf_counter() - t0, produced, drafted, accepted


def prefill_ms(
    args: argparse.Namespace, model: Model, active: list[int], rng: np.random.Generator
) -> list[float]:
    """Time to the first token of a prompt, once per repeat (ms)."""
    out = []
    for _ in range(args.repeats + 2):
        x = rng.standard_normal((args.prompt_tokens, model.hidden), dtype=np.float32)
        t0 = time.perf_counter()
        model.forward(x, active)
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draft-k", type=int, default=0, help="drafted tokens per step (0: off)")
    p.add_argument("--skip-threshold", type=float, default=1.0, help="skip layers with cos > T")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=32, help="tokens to generate per repeat")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fault", choices=["none", "exit3", "nojson", "hang"], default="none")
    args = p.parse_args(argv)
    if args.draft_k < 0 or not 0.0 < args.skip_threshold <= 1.0:
        p.error("--draft-k must be >= 0 and --skip-threshold in (0, 1]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.fault == "exit3":
        print("toy_streamer: simulated CUDA out of memory while loading tier A", file=sys.stderr)
        return 3
    if args.fault == "hang":
        print("toy_streamer: hanging (simulated deadlock)", file=sys.stderr, flush=True)
        while True:
            time.sleep(1)
    model = Model(args.layers, args.hidden, args.seed)
    cos = model.cosines(args.seed)
    skipped = [i for i in range(args.layers) if i > 0 and cos[i] > args.skip_threshold]
    active = [i for i in range(args.layers) if i not in skipped]
    draft = Draft(model, active[: max(1, len(active) // 4)])
    loss = float(sum(1.0 - cos[i] for i in skipped))
    accept_p = max(0.05, 0.8 - 8.0 * loss)  # skipping also hurts draft acceptance
    rng = np.random.default_rng(args.seed + 2)
    model.forward(np.ones((1, args.hidden), np.float32), active)  # warm-up
    tps, drafted, accepted = [], 0, 0
    for _ in range(args.repeats):
        seconds, produced, d, a = decode(args, model, active, draft, accept_p, rng)
        tps.append(produced / seconds)
        drafted += d
        accepted += a
    ttft = prefill_ms(args, model, active, rng)
    metrics = {
        "decode_tps": float(np.median(tps)),
        "ttft_p50_ms": float(np.median(ttft)),
        "ttft_p95_ms": float(np.percentile(ttft, 95)),
        "ppl_delta_pct": 100.0 * loss,  # the quality cost of the skipped layers
        "accept_rate": accepted / drafted if drafted else 0.0,
        "skipped_layers": len(skipped),
    }
    if args.fault == "nojson":
        print(f"decode {metrics['decode_tps']:.1f} tok/s (no JSON today)")
        return 0
    params = os.environ.get("AUTOTUNE_PARAMS", "{}")
    print(
        f"toy_streamer: layer cos {np.round(cos, 4).tolist()}; skipped {skipped}; params {params}"
    )
    print(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
