"""``--dry-run`` prints the whole plan, runs no trial and writes nothing.

Run through the real CLI in a subprocess whose working directory must stay empty, on the
shipped presets (CPU, command engine, a GPU cluster preset on a machine without GPUs).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def dry_run(tmp_path: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "run", *args, "--dry-run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert list(tmp_path.iterdir()) == [], "a dry run must write nothing"
    return proc.stdout


COMMON = [
    "resolved config",
    "search space",
    "space size:",
    "rules (checked before launch",
    "objectives: decode_tps (maximize), ttft_p95_ms (minimize)",
    "constraints:",
    "winner: select.rule",
    "resource plan",
    "this machine:",
    "budget:",
    "sampler:",
    "trial 0: the baseline",
    "dry run: no trial was started and nothing was written",
]

PRESETS = [
    (
        ["conf=command_example"],
        [
            "engine:\n  kind: command",
            "draft_k",
            "int [0, 8]",
            "float [0.95, 1.0] step 0.0025",
            "space size: 189 configurations",
            "constraints: ppl_delta_pct <= 2",
            "trial 0 runs: ",
            "bench/engines/toy_streamer.py --draft-k 0 --skip-threshold 1.0 --tokens 32",
            "trial 0 (baseline) reserves 1 CPU, 0 GPU",
            "sampler: auto -> ",
            "trial 0: the baseline {'draft_k': 0, 'skip_threshold': 1.0}",
        ],
    ),
    (
        [
            "conf=local_cpu",
            "study.sampler=random",
            "study.timeout_s=600",
            "study.enqueue=[{n_threads:1,n_batch:256,n_ubatch:256}]",
        ],
        [
            "kind: llamacpp",
            "rules[0]: n_ubatch <= n_batch  (n_ubatch must not exceed n_batch)",
            "rules[1]: flash_attn when type_v != 'f16'",
            "sampler: random, seed 0",
            "budget: 16 trials or 600 s, whichever comes first",
            "trial 1: enqueued {'n_threads': 1, 'n_batch': 256, 'n_ubatch': 256}",
            "constraints: ppl_delta_pct <= 2, ttft_p95_ms <= 1.5x baseline; 'baseline' is trial 0's measurement (the engine's defaults), which runs first",
        ],
    ),
    (
        ["conf=command_example", "study.search=pareto"],
        ["sampler: auto -> bo (Gaussian process over the launchable configurations, speed prediction "
         "as prior; expected hypervolume improvement of the two objectives' front), seed 0"],
    ),
    (
        ["conf=hydra_cluster"],
        [
            "kind: exllamav2",
            "gpu_split",
            "(when draft_model != 'none')",
            "cannot run here",
        ],
    ),
]


@pytest.mark.parametrize(("args", "needles"), PRESETS, ids=[a[0] for a, _ in PRESETS])
def test_dry_run_prints_the_plan(tmp_path: Path, args: list[str], needles: list[str]):
    out = dry_run(tmp_path, *args)
    for needle in COMMON + needles:
        assert needle in out, f"{needle!r} missing from:\n{out}"


def test_dry_run_in_process_matches_the_space():
    """print_plan on a compiled config: every parameter appears with its baseline."""
    from rich.console import Console

    from autotune.cli.main import prepare
    from autotune.run.plan import print_plan

    cfg, space, baseline = prepare(["conf=command_example", "space.draft_k.high=4"], None, True)
    console = Console(record=True, width=200)
    print_plan(cfg, space, baseline, console)
    text = console.export_text()
    assert "int [0, 4]" in text and "space size: 105 configurations" in text
    for name, value in baseline.items():
        assert name in text and str(value) in text
