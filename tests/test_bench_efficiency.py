"""bench/efficiency.py and its simulated surfaces: the truth, the simulated engine, a smoke run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SURFACES = ROOT / "bench" / "surfaces"
sys.path.insert(0, str(SURFACES))

from truth import load  # noqa: E402


@pytest.mark.parametrize("name", ["exl2_70b", "streamer_70b", "llamacpp_7b", "cpu_7b"])
def test_surface_truth_is_a_needle_with_a_worse_baseline(name):
    truth = load(name)
    share = truth.n_within95 / truth.n_configs
    assert 0.001 < share < 0.05, share  # a few configurations near the optimum, not a plateau
    assert 0 < truth.n_feasible < truth.n_configs  # constraints and failures bind
    baseline = truth.preset["engine"]["settings"]["defaults"]
    assert truth.credit(baseline) < 0.9 * truth.optimum


def test_streamer_draft_and_skipping_cancel():
    """Seed 001: each trick alone helps, together they give nothing over skipping alone."""
    from models import streamer_70b

    base = {"draft_model": "8b", "draft_k": 0, "skip_threshold": 1.0, "ctx": 4096, "kv_type": "f32"}
    plain = streamer_70b(base)["decode_tps"]
    spec = streamer_70b({**base, "draft_k": 4})["decode_tps"]
    skip = streamer_70b({**base, "skip_threshold": 0.98})["decode_tps"]
    both = streamer_70b({**base, "draft_k": 4, "skip_threshold": 0.98})["decode_tps"]
    assert spec > 1.1 * plain and skip > 1.3 * plain
    assert both < 1.05 * plain


def _sim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SURFACES / "sim.py"), *args], capture_output=True,
                          text=True, timeout=30)


def test_sim_noise_is_seeded_by_the_trial_directory():
    args = ["cpu_7b", "--quant", "Q4_K_M", "--n_threads", "8", "--n_threads_batch", "8",
            "--n_batch", "128", "--n_ctx", "512"]
    a = json.loads(_sim(*args, "--workdir", "/t/1").stdout)
    b = json.loads(_sim(*args, "--workdir", "/t/1").stdout)
    c = json.loads(_sim(*args, "--workdir", "/t/2").stdout)
    assert a == b and a["decode_tps"] != c["decode_tps"]
    assert abs(a["decode_tps"] / c["decode_tps"] - 1) < 0.2
    assert a["ppl_delta_pct"] == c["ppl_delta_pct"]  # quality is not timing: no noise


def test_sim_oom_exits_1_with_the_engine_message():
    out = _sim("exl2_70b", "--workdir", "/t", "--bpw", "4.5", "--cache_mode", "FP16", "--gpu_split",
               "31,21", "--draft_k", "0", "--max_seq_len", "32768")
    assert out.returncode == 1 and "CUDA out of memory on GPU 0" in out.stderr


@pytest.mark.slow
def test_quick_bench_through_the_real_cli(tmp_path):
    res = tmp_path / "eff"
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "efficiency.py"), "--quick",
                          "--results", str(res), "--out", str(tmp_path / "studies")],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    data = json.loads(res.with_suffix(".json").read_text())
    assert {r["method"] for r in data["rows"]} == {"default", "random"}
    for run in data["runs"]:
        assert run["rc"] == 0 and 1 <= len(run["curve"]) <= 8
        assert all(0.0 <= x <= 1.0 for x in run["curve"])
    assert "trials to 95%" in res.with_suffix(".txt").read_text()
    studies = tmp_path / "studies" / "cpu_7b" / "default" / "s0"
    assert (studies / "summary.json").exists() and (studies / "trials" / "0000" / "command.stdout").exists()


@pytest.mark.parametrize("bench", ["efficiency.py", "sampler_cost.py"])
def test_bench_smoke_mode_runs_in_seconds_and_exits_0(bench):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / bench), "--smoke"], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert ("random" in out.stdout) if bench == "efficiency.py" else ("s/ask" in out.stdout)


def test_efficiency_reports_a_wilson_interval_and_quartiles():
    sys.path.insert(0, str(ROOT / "bench"))
    import efficiency

    assert efficiency.wilson(10, 10)[0] == pytest.approx(0.722, abs=1e-3)  # 10 of 10: [72%, 100%]
    lo, hi = efficiency.wilson(3, 10)
    assert lo < 0.3 < hi
    assert efficiency._quartiles([9.0, 10.0, 12.0, 14.0, 15.0]) == (10.0, 14.0)
    assert efficiency._quartiles([3.0, float("inf")])[1] == float("inf")
