"""A simulated engine for ``engine.kind: command``: one surface of bench/surfaces/models.py.

Usage: ``python bench/surfaces/sim.py SURFACE --workdir DIR [--knob VALUE ...]``. Prints one
JSON line of metrics with log-normal timing noise (``--noise``, default 3%); an OOM or crash
of the model exits 1 with the engine's message on stderr, as a real engine would.

The noise is seeded by the trial's directory (a study is reproducible), or, with
``--noise-seed N`` (N >= 0; the surfaces pass ``engine.settings.vars.noise_seed``), by the
surface, the configuration, N and the repeat (the directory's tag: ``trials`` for a search
trial, ``<tag>/<number>`` for a re-measurement) only: two methods that measure the same
configuration under the same seed see the same noise (paired comparisons, issue 23).
``--instance N`` (N >= 0; ``engine.settings.vars.instance``) runs instance N of the surface's
family (bench/surfaces/families.py, issue 41) with that instance's own noise level.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import families  # noqa: E402
from models import NOISE  # noqa: E402
from models import SimFailure  # noqa: E402

TIMED = ("decode_tps", "ttft_p50_ms", "ttft_p95_ms")


def parse(argv: list[str]) -> tuple[str, dict, str, float, int, int]:
    """(surface, params, workdir, noise, noise seed, instance) from ``SURFACE --name value ...``."""
    surface, rest = argv[0], argv[1:]
    params: dict = {}
    for flag, text in zip(rest[::2], rest[1::2]):
        try:
            params[flag.lstrip("-").replace("-", "_")] = json.loads(text)
        except ValueError:
            params[flag.lstrip("-").replace("-", "_")] = text
    workdir = str(params.pop("workdir", ""))
    noise = float(params.pop("noise", 0.03))
    noise_seed = int(params.pop("noise_seed", -1))
    instance = int(params.pop("instance", -1))
    return surface, params, workdir, noise, noise_seed, instance


def noise_key(surface: str, params: dict, workdir: str, noise_seed: int = -1) -> str:
    """What seeds a measurement's noise: the trial directory, or (noise_seed >= 0) the
    configuration, the seed and the repeat, so methods are compared on the same draws."""
    if noise_seed < 0:
        return f"{surface}|{workdir}"
    path = Path(workdir)
    repeat = path.parent.name if path.parent.name == "trials" else f"{path.parent.name}/{path.name}"
    config = json.dumps(sorted((k, str(v)) for k, v in params.items()))
    return f"{surface}|{config}|{noise_seed}|{repeat}"


def measure(surface: str, params: dict, workdir: str, noise: float, noise_seed: int = -1,
            instance: int = -1) -> dict[str, float]:
    """The surface's metrics with each timing scaled by exp(N(0, noise)); the noise of a
    surface that declares its own (``NOISE``) replaces the default. ``instance`` >= 0: that
    instance of the surface's family (bench/surfaces/families.py), with its own drawn noise."""
    metrics = families.model(surface, instance)(params)
    if instance < 0:
        return with_noise(metrics, surface, noise_key(surface, params, workdir, noise_seed), noise)
    key = noise_key(f"{surface}#{instance}", params, workdir, noise_seed)
    return with_noise(metrics, surface, key, families.noise(surface, instance), own=False)


def with_noise(metrics: dict[str, float], surface: str, key: str, noise: float = 0.03,
               own: bool = True) -> dict[str, float]:
    """``metrics`` with each timing scaled by exp(N(0, noise)) drawn from ``key`` (the same
    key, the same draws: noise paired across methods); a surface's own ``NOISE`` wins (``own``)."""
    noise = NOISE.get(surface, noise) if own else noise
    rng = random.Random(int(hashlib.sha256(key.encode()).hexdigest()[:16], 16))
    metrics = dict(metrics)
    for k in TIMED:
        if k in metrics:
            metrics[k] *= rng.lognormvariate(0.0, noise)
    metrics["ttft_p95_ms"] = max(metrics["ttft_p95_ms"], metrics["ttft_p50_ms"])
    return metrics


def main(argv: list[str]) -> int:
    surface, params, workdir, noise, noise_seed, instance = parse(argv)
    try:
        metrics = measure(surface, params, workdir, noise, noise_seed, instance)
    except SimFailure as e:
        print(str(e), file=sys.stderr)
        return 1
    print(json.dumps({k: round(v, 4) for k, v in metrics.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
