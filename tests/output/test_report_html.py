"""report.html's trials table says why each trial is not feasible, a broken constraint included."""

from __future__ import annotations

import optuna

from autotune.config.schema import load_config
from autotune.output.report_html import trials_table
from autotune.record import study as studylib
from autotune.search.space import compile_space
from autotune.trial.spec import TrialResult


def _cfg():
    return load_config({
        "engine": {"kind": "command", "settings": {
            "argv": ["x", "{a}"], "knobs": {"a": {"type": "int", "low": 0, "high": 9}}, "defaults": {"a": 0}}},
        "space": {"a": {"type": "int", "low": 0, "high": 9}},
        "objectives": ["decode_tps"],
        "constraints": ["ttft_p95_ms <= 100", "decode_tps >= 5"],
        "quality": {"enabled": False},
    })


def test_the_reason_cell_names_each_broken_constraint_with_its_measured_value():
    cfg = _cfg()
    space = compile_space(cfg)
    study = optuna.create_study(directions=studylib.directions(cfg))
    told = [TrialResult(0, "ok", {"decode_tps": 12.0, "ttft_p95_ms": 80.0}),
            TrialResult(0, "ok", {"decode_tps": 3.0, "ttft_p95_ms": 150.0}),
            TrialResult(0, "failed", reason="llama_decode: failed to find a KV slot")]
    for result in told:
        trial = study.ask()
        params = space.suggest(trial)
        studylib.tell(study, trial, cfg, params, TrialResult(trial.number, result.status, result.metrics,
                                                             reason=result.reason))
    rows = trials_table(study, ["decode_tps", "ttft_p95_ms"]).split("<tr class=")[1:]
    cells = [r.split("<td>")[-1].split("</td>")[0] for r in rows]
    assert cells[0] == ""  # feasible: nothing broken
    assert cells[1] == "broke ttft_p95_ms &lt;= 100 (measured 150); decode_tps &gt;= 5 (measured 3)"
    assert cells[2] == "llama_decode: failed to find a KV slot"
