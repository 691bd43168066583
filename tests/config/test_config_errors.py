"""Bad configs fail before anything runs: one line on stderr, exit 2, nothing written.

The corpus is ``tests/configs/bad/*.yaml``: each a complete preset whose header says what
the one-line error must contain (``# expect:`` path, value and what is allowed; ``# hint:``
the did-you-mean), whether it is also run without ``--dry-run`` (``# also-run: true``) and
what it needs (``# requires: no-torch``). Each runs through ``autotune.cli.main.main`` in this
process (tests/helpers/cli.py: the fast loop), from an empty temporary directory that must stay
empty; one case also runs as a real subprocess to prove the entry point does the same.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli_here

REPO = Path(__file__).resolve().parents[2]
BAD = REPO / "tests" / "configs" / "bad"
HAS_TORCH = importlib.util.find_spec("torch") is not None


def header(path: Path) -> dict[str, str]:
    """The ``# key: value`` lines at the top of a corpus file."""
    out = {}
    for line in path.read_text().splitlines():
        if not line.startswith("# "):
            break
        key, _, value = line[2:].partition(": ")
        out[key.strip()] = value.strip()
    return out


def run_cli(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", "run", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, (
        f"exit {proc.returncode}; stderr:\n{proc.stderr}\nstdout:\n{proc.stdout}"
    )
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(lines) == 1, f"expected one line on stderr, got:\n{proc.stderr}"
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


CASES = sorted(BAD.glob("*.yaml"))
RUN_CASES = [p for p in CASES if header(p).get("also-run") == "true"]


def test_corpus_is_large_and_annotated():
    assert len(CASES) >= 25
    for path in CASES:
        assert header(path).get("expect"), f"{path.name} has no '# expect:' line"


def _skip_if_unmet(path: Path) -> dict[str, str]:
    head = header(path)
    if head.get("requires") == "no-torch" and HAS_TORCH:
        pytest.skip("torch is installed, so the GP sampler is available")
    return head


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_bad_config_dry_run(path: Path, tmp_path: Path):
    head = _skip_if_unmet(path)
    proc = run_cli_here(["run", "--config-dir", str(BAD), f"conf={path.stem}", "--dry-run"], tmp_path)
    line = assert_one_line_error(proc, head["expect"], *([head["hint"]] if "hint" in head else []))
    assert line.startswith("autotune: error: ")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path", RUN_CASES, ids=[p.stem for p in RUN_CASES])
def test_bad_config_real_run_writes_nothing(path: Path, tmp_path: Path):
    head = _skip_if_unmet(path)
    proc = run_cli_here(["run", "--config-dir", str(BAD), f"conf={path.stem}"], tmp_path)
    assert_one_line_error(proc, head["expect"])
    assert list(tmp_path.iterdir()) == [], (
        "a failed start must write nothing (no studies/, mlruns/)"
    )


OVERRIDES = [
    (["study.n_trial=3"], "study.n_trial: got 'n_trial'; unknown key", "Did you mean: n_trials?"),
    (["study.n_trials=0"], "study.n_trials: got 0; must be > 0", ""),
    (["space.n_threads.high=x"], "space.n_threads.high: got 'x'; expected an integer", ""),
    (
        ["space.n_thread.high=3"],
        "space.n_thread: got 'n_thread'; unknown key",
        "Did you mean: n_threads?",
    ),
    (
        ["engine=llamacp"],
        "engine: got 'llamacp'; unknown option of config group engine",
        "Did you mean: llamacpp?",
    ),
    (["conf=local_cpuu"], "conf: got 'local_cpuu'; unknown preset", "Did you mean: local_cpu?"),
    (["study.n_trials=[1"], "study.n_trials: got 'study.n_trials=[1'; not a valid override", ""),
    (
        ["+study.n_trials=3"],
        "study.n_trials: got '+study.n_trials=3'; study.n_trials already exists",
        "++study.n_trials=VALUE",
    ),
    (
        ["~study.n_trails"],
        "study.n_trails: got 'n_trails'; unknown key",
        "Did you mean: n_trials?",
    ),
    (["study.n_trials=${nope}"], "study.n_trials: got '${nope}'; interpolation key not found", ""),
    (
        ["study.sampler=tpe", "select.rule=knees"],
        "select.rule: got 'knees'; unknown rule",
        "Did you mean: knee?",
    ),
    (["--config-dir", "no/such/dir"], "--config-dir: got 'no/such/dir'; expected an existing", ""),
]


@pytest.mark.parametrize(
    ("args", "expect", "hint"), OVERRIDES, ids=[" ".join(a) for a, _, _ in OVERRIDES]
)
def test_bad_override(args: list[str], expect: str, hint: str, tmp_path: Path):
    proc = run_cli_here(["run", *args, "--dry-run"], tmp_path)
    assert_one_line_error(proc, expect, hint)
    assert list(tmp_path.iterdir()) == []


def test_corpus_covers_every_case_of_issue_10():
    names = {p.stem for p in CASES}
    for case in ("workload_prompts_unknown", "quality_text_missing", "workload_max_tokens_huge",
                 "tracking_uri_bad_scheme", "space_n_ctx_too_small_for_workload",
                 "constraints_contradict", "select_metric_unknown", "objectives_empty"):
        assert case in names
    assert len(CASES) >= 90


def test_missing_model_file_refused_on_a_real_run(tmp_path: Path, tmp_path_factory):
    """Variant paths are checked before a real run (``--dry-run`` of a GPU preset works anywhere)."""
    conf = tmp_path_factory.mktemp("conf")
    (conf / "missing_model.yaml").write_text(
        "defaults: [base, {engine: llamacpp}, {workload: short}, _self_]\n"
        "engine:\n  settings: {default_variant: mine}\n"
        "  variants: {mine: {path: /no/such/model.gguf}}\n"
        "space:\n  n_threads: {type: int, low: 1, high: 2}\n"
        "quality: {enabled: false}\n")
    args = ["--config-dir", str(conf), "conf=missing_model"]
    assert run_cli_here(["run", *args, "--dry-run"], tmp_path).returncode == 0
    proc = run_cli(args, tmp_path)  # the real entry point, in a subprocess
    assert_one_line_error(proc, "engine.variants.mine.path: got '/no/such/model.gguf'; no such file")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
def test_failing_quality_reference_is_one_line_and_the_parent_run_ends_failed(tmp_path: Path):
    """A quantized V cache without flash_attn cannot start: the reference fails cleanly."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    proc = run_cli(["conf=local_cpu", "study.name=ref", f"study.dir={tmp_path}/studies/ref",
                    f"tracking.uri={uri}", f"tracking.artifacts={tmp_path}/mlruns/artifacts",
                    "rules=[]", "quality.reference.type_v=q8_0", "+quality.reference.flash_attn=false"],
                   tmp_path, timeout=600)
    line = assert_one_line_error(proc, "quality.reference: got ", "the reference configuration failed")
    log = Path(line.rsplit("log: ", 1)[1])
    assert log.exists() and log.name == "trial.log"
    runs = MlflowClient(tracking_uri=uri).search_runs(
        [MlflowClient(tracking_uri=uri).get_experiment_by_name("ref").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]
