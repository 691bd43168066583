"""The Pareto search: ``study.search: pareto`` is constrained multi-objective BO by default.

``auto`` resolves to ``bo`` for two objectives (exact EHVI over the pool:
tests/search/test_bo_pareto.py) and to Optuna's ``GPSampler`` (LogCEHVI: one GP per objective
and per constraint) for three or more, behind the startup design; the named samplers stay
selectable; ``bo`` with three objectives is refused in one line. The GP sampler reads the
constraints the driver sets with ``trial.set_constraint`` and stays out of an infeasible
region that the objectives pull it towards. Real CLI studies on the fake engine run both end
to end, and bench/pareto.py's smoke run scores them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune.errors import ConfigError
from autotune.search.bo import PoolSampler
from autotune.search.samplers import make_sampler
from autotune.search.samplers import resolve
from autotune.search.samplers import torch_available
from autotune.search.samplers import uses_design
from autotune.search.samplers import validate_sampler
from tests.conftest import study_overrides

ROOT = Path(__file__).resolve().parents[2]
needs_torch = pytest.mark.skipif(not torch_available(), reason="GPSampler needs torch")


def test_auto_is_bo_for_two_objectives_behind_the_design():
    assert resolve("auto", "pareto") == resolve("auto", "pareto", 2) == "bo"
    assert resolve("auto", "single", 3) == "bo"
    sampler = make_sampler("auto", 0, None, 30, 8, "pareto", objectives=["decode_tps", "vram_peak_gb"])
    assert isinstance(sampler, PoolSampler) and sampler.objectives == ["decode_tps", "vram_peak_gb"]
    assert uses_design("auto") and uses_design("bo")


@needs_torch
def test_auto_is_the_constrained_gp_for_three_objectives():
    assert resolve("auto", "pareto", 3) == "gp"
    sampler = make_sampler("auto", 0, None, 30, 8, "pareto", objectives=["decode_tps", "vram_peak_gb", "ttft_p95_ms"])
    assert isinstance(sampler, optuna.samplers.GPSampler)
    assert uses_design("gp")


@pytest.mark.parametrize(("name", "cls"), [
    ("tpe", optuna.samplers.TPESampler), ("nsga2", optuna.samplers.NSGAIISampler),
    ("random", optuna.samplers.RandomSampler),
    pytest.param("gp", optuna.samplers.GPSampler, marks=needs_torch),
])
def test_named_samplers_stay_selectable_for_a_pareto_search(name, cls):
    assert resolve(name, "pareto") == name
    assert isinstance(make_sampler(name, 0, None, 30, 8, "pareto"), cls)


def test_bo_is_refused_for_a_pareto_search_over_three_objectives_in_one_line():
    validate_sampler("bo", None, "pareto", 2)
    with pytest.raises(ConfigError, match="bo's Pareto search takes two objectives, not 3") as e:
        validate_sampler("bo", None, "pareto", 3)
    assert e.value.path == "study.sampler" and "\n" not in str(e.value)


def test_the_cli_refuses_bo_for_three_objectives_with_one_line_and_writes_nothing(cli, tmp_path):
    done = cli("run", "conf=fake_gpus", "study.search=pareto", "study.sampler=bo",
               "objectives=[decode_tps,ttft_p95_ms,vram_peak_gb]", *study_overrides(tmp_path, "refused"),
               timeout=120)
    err = [x for x in done.stderr.splitlines() if x.strip()]
    assert done.returncode == 2 and len(err) == 1, done.stdout[-1500:] + done.stderr[-1500:]
    assert "study.sampler" in err[0] and "takes two objectives, not 3" in err[0]
    assert not (tmp_path / "studies" / "refused").exists()


def _objectives(x: float, y: float) -> tuple[float, float]:
    """Both maximised; both grow with y, so the unconstrained front lies at y = 1."""
    return x + y, 1.0 - x + y


def _proposals(constrained: bool, n: int = 6) -> list[float]:
    """y of the GP sampler's ``n`` proposals after a 3 x 3 design, feasible iff y <= 0.4."""
    sampler = make_sampler("gp", 0, None, 20, 9, "pareto")
    study = optuna.create_study(directions=["maximize", "maximize"], sampler=sampler)
    for x in (0.1, 0.5, 0.9):
        for y in (0.1, 0.5, 0.9):
            study.enqueue_trial({"x": x, "y": y})
    ys = []
    for i in range(9 + n):
        trial = study.ask()
        x, y = trial.suggest_float("x", 0.0, 1.0), trial.suggest_float("y", 0.0, 1.0)
        if constrained:
            trial.set_constraint("y <= 0.4", y - 0.4)  # how the driver tells constraints
        study.tell(trial, _objectives(x, y))
        if i >= 9:
            ys.append(y)
    return ys


@pytest.mark.slow
@needs_torch
def test_the_gp_sampler_reads_set_constraint_and_avoids_the_infeasible_region():
    constrained, free = _proposals(True), _proposals(False)
    assert sum(y <= 0.42 for y in constrained) >= 5, constrained  # the feasible edge, y ~ 0.4
    assert sum(y > 0.6 for y in free) >= 4, free  # the same sampler without constraints goes up


@pytest.mark.slow
@pytest.mark.parametrize(("sampler", "shown"), [
    ("auto", "sampler auto (bo)"), pytest.param("gp", "sampler gp", marks=needs_torch)])
def test_a_real_pareto_study_runs_end_to_end(cli, tmp_path, sampler, shown):
    done = cli("run", "conf=fake_gpus", "study.search=pareto", "study.n_trials=8", "study.n_startup=4",
               f"study.sampler={sampler}", "space.duration_s.value=0.0", "ray.max_concurrent=1",
               "ray.num_cpus=2", "select.top_k=0", "report.enabled=false", "tracking.enabled=false",
               "constraints=['ttft_p95_ms <= 1000']",  # a loaded box must not leave the front empty
               *study_overrides(tmp_path, "par"), timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert shown in done.stdout
    study_dir = tmp_path / "studies" / "par"
    summary = json.loads((study_dir / "summary.json").read_text())
    assert summary["n_trials"] == 8
    assert summary["pareto"], summary
    assert (study_dir / "pareto.json").exists()


def test_the_bench_hypervolume_is_exact_in_2d():
    sys.path.insert(0, str(ROOT / "bench"))
    from pareto import hypervolume

    points = [(-3.0, 5.0), (-2.0, 2.0), (-1.0, 1.0), (-2.5, 6.0)]  # the last is dominated
    assert hypervolume(points, (0.0, 10.0)) == pytest.approx(3 * 5 + 2 * 3 + 1 * 1)
    assert hypervolume([(1.0, 1.0)], (0.0, 10.0)) == 0.0  # beyond the reference point


@pytest.mark.slow
def test_the_pareto_bench_smoke_run_scores_every_method(tmp_path):
    results = ROOT / "bench" / "results"
    before = {p: p.stat().st_mtime_ns for p in results.rglob("*") if p.is_file()}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "pareto.py"), "--smoke"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for method in ("default", "tpe", "random"):
        assert f"│ {method}" in proc.stdout, proc.stdout
    assert "side by side on the same seeds" in proc.stdout
    assert "all: default vs tpe: won " in proc.stdout and " of 1 paired studies" in proc.stdout
    assert {p: p.stat().st_mtime_ns for p in results.rglob("*") if p.is_file()} == before
    assert list(tmp_path.iterdir()) == []


def test_the_pareto_bench_rescores_its_stored_curves(tmp_path):
    """--rescore prints the table of results .json files again, their studies pooled, once,
    with the side-by-side counts, and writes nothing."""
    stored = json.loads((ROOT / "bench" / "results" / "pareto.json").read_text())
    runs = [r for r in stored["curves"] if r["surface"] == "streamer_70b" and r["seed"] in (100, 101)]
    for seed in (100, 101):
        (tmp_path / f"p{seed}.json").write_text(json.dumps(
            {"command": f"x{seed}", "curves": [r for r in runs if r["seed"] == seed]}))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "pareto.py"), "--rescore",
                           str(tmp_path / "p100.json"), str(tmp_path / "p101.json")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    hit = {(r["method"], r["seed"]): r["curve"][19] >= 0.90 for r in runs}
    won = sum(hit[("default", s)] and not hit[("tpe", s)] for s in (100, 101))
    lost = sum(hit[("tpe", s)] and not hit[("default", s)] for s in (100, 101))
    assert f"all: default vs tpe: won {won}, lost {lost} of 2 paired studies" in proc.stdout, proc.stdout
    assert proc.stdout.count("Pareto search: hypervolume") == 1, proc.stdout
    assert "10 studies rescored" in proc.stdout and "(x100; x101)" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p100.json", "p101.json"]
