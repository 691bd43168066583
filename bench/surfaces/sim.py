"""A simulated engine for ``engine.kind: command``: one surface of bench/surfaces/models.py.

Usage: ``python bench/surfaces/sim.py SURFACE --workdir DIR [--knob VALUE ...]``. Prints one
JSON line of metrics with log-normal timing noise (``--noise``, default 3%), seeded by the
trial's directory so a study is reproducible; an OOM or crash of the model exits 1 with the
engine's message on stderr, as a real engine would.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import SURFACES  # noqa: E402
from models import SimFailure  # noqa: E402

TIMED = ("decode_tps", "ttft_p50_ms", "ttft_p95_ms")


def parse(argv: list[str]) -> tuple[str, dict, str, float]:
    """(surface, params, workdir, noise) from ``SURFACE --name value ...``."""
    surface, rest = argv[0], argv[1:]
    params: dict = {}
    for flag, text in zip(rest[::2], rest[1::2]):
        try:
            params[flag.lstrip("-").replace("-", "_")] = json.loads(text)
        except ValueError:
            params[flag.lstrip("-").replace("-", "_")] = text
    workdir = str(params.pop("workdir", ""))
    noise = float(params.pop("noise", 0.03))
    return surface, params, workdir, noise


def measure(surface: str, params: dict, workdir: str, noise: float) -> dict[str, float]:
    """The surface's metrics with each timing scaled by exp(N(0, noise))."""
    metrics = SURFACES[surface](params)
    seed = hashlib.sha256(f"{surface}|{workdir}".encode()).hexdigest()
    rng = random.Random(int(seed[:16], 16))
    for key in TIMED:
        if key in metrics:
            metrics[key] *= rng.lognormvariate(0.0, noise)
    metrics["ttft_p95_ms"] = max(metrics["ttft_p95_ms"], metrics["ttft_p50_ms"])
    return metrics


def main(argv: list[str]) -> int:
    surface, params, workdir, noise = parse(argv)
    try:
        metrics = measure(surface, params, workdir, noise)
    except SimFailure as e:
        print(str(e), file=sys.stderr)
        return 1
    print(json.dumps({k: round(v, 4) for k, v in metrics.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
