"""Every bench in bench/ keeps running after a refactor: ``--help`` and a ``--smoke`` run.

A new bench is picked up by the glob; a bench without a ``--smoke`` mode fails here. The
smoke runs of soak.py, efficiency.py, sampler_cost.py, peers.py and pareto.py assert more and
live beside the tests of what they measure (``SMOKE_ELSEWHERE``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHES = sorted(p for p in (ROOT / "bench").glob("*.py"))
SMOKE_ELSEWHERE = {"soak.py": ROOT / "tests" / "test_soak.py",
                   "efficiency.py": ROOT / "tests" / "test_bench_efficiency.py",
                   "sampler_cost.py": ROOT / "tests" / "test_bench_efficiency.py",
                   "pareto.py": ROOT / "tests" / "search" / "test_pareto.py",
                   "peers.py": ROOT / "tests" / "engines" / "test_llama_server.py"}


def _run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def test_there_are_benches():
    assert {"efficiency.py", "fidelity.py", "parallel.py", "slots.py", "soak.py", "time_to_answer.py"} <= {p.name for p in BENCHES}


@pytest.mark.parametrize("bench", BENCHES, ids=[p.stem for p in BENCHES])
def test_bench_starts_and_has_a_smoke_mode(bench: Path, tmp_path: Path):
    proc = _run([str(bench), "--help"], tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--smoke" in proc.stdout, f"{bench.name} has no --smoke mode"
    assert list(tmp_path.iterdir()) == [], f"{bench.name} --help wrote files"


SMOKE_HERE = [p for p in BENCHES if p.name not in SMOKE_ELSEWHERE]


@pytest.mark.slow
@pytest.mark.parametrize("bench", SMOKE_HERE, ids=[p.stem for p in SMOKE_HERE])
def test_bench_smoke_run(bench: Path, tmp_path: Path):
    """Runs in seconds to a minute; prints its table and writes nothing under bench/results."""
    results = ROOT / "bench" / "results"
    before = {p: p.stat().st_mtime_ns for p in results.rglob("*") if p.is_file()}
    proc = _run([str(bench), "--smoke"], tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip(), f"{bench.name} --smoke printed no table"
    after = {p: p.stat().st_mtime_ns for p in results.rglob("*") if p.is_file()}
    assert after == before, f"{bench.name} --smoke changed bench/results"


@pytest.mark.parametrize("name", sorted(SMOKE_ELSEWHERE))
def test_smoke_runs_elsewhere_use_the_smoke_mode(name: str):
    assert "--smoke" in SMOKE_ELSEWHERE[name].read_text()


def test_time_to_answer_runs_a_search_variant_beside_the_default(tmp_path: Path):
    """--variant (bench/efficiency.py's VARIANTS): each method again with the variant set, its
    rows labelled METHOD:VARIANT; an unknown one is refused before any study runs."""
    bench = str(ROOT / "bench" / "time_to_answer.py")
    proc = _run([bench, "--smoke", "--no-before", "--variant", "base,noctx"], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if "exl2_70b" in line]
    assert [r.split("│")[2].strip() for r in rows] == ["now", "now:noctx"], proc.stdout[-3000:]
    bad = _run([bench, "--smoke", "--variant", "nosuch"], tmp_path, timeout=120)
    assert bad.returncode == 2 and "unknown --variant nosuch" in bad.stderr, bad.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []
