"""Exports: Pareto files, best.yaml as a reusable preset, atomic writes."""

from __future__ import annotations

import csv
import json

import yaml

from autotune.config.compose import compose
from autotune.config.schema import load_config
from autotune.config.validate import compile_space
from autotune.output.export import write_all
from autotune.record.summary import StudySummary
from autotune.search.select import pareto_front
from autotune.search.trials import Record


def _cfg(tmp_path):
    cfg = load_config(compose(["conf=local_cpu", f"study.dir={tmp_path}"]))
    return cfg, compile_space(cfg)


def test_pareto_front_drops_dominated_and_infeasible():
    a = Record(0, {}, {"decode_tps": 50, "ttft_p95_ms": 100})
    b = Record(1, {}, {"decode_tps": 80, "ttft_p95_ms": 120})
    c = Record(2, {}, {"decode_tps": 40, "ttft_p95_ms": 130})  # dominated by a
    d = Record(3, {}, {"decode_tps": 99, "ttft_p95_ms": 10}, feasible=False)
    assert [r.number for r in pareto_front([a, b, c, d], ["decode_tps", "ttft_p95_ms"])] == [0, 1]


def test_write_all_produces_every_file(tmp_path):
    cfg, space = _cfg(tmp_path)
    params = {"model": "q4_0", "n_threads": 2, "n_threads_batch": 2, "n_batch": 256, "n_ubatch": 128,
              "n_ctx": 1024, "flash_attn": True, "type_k": "q8_0", "type_v": "q8_0"}
    win = Record(3, params, {"decode_tps": 90.0, "ttft_p95_ms": 120.0})
    summary = StudySummary(study="s", engine="llamacpp", interrupted=False, winner=win)
    files, written = write_all(tmp_path, cfg, space, [win], win, summary)
    assert written == StudySummary.load(tmp_path / "summary.json")
    names = {f.name for f in files}
    assert {"pareto.json", "pareto.csv", "best.yaml", "llama-server.sh", "llama_cpp_kwargs.json", "summary.json"} <= names
    rows = list(csv.DictReader((tmp_path / "pareto.csv").open()))
    assert rows[0]["number"] == "3" and rows[0]["type_k"] == "q8_0"
    kw = json.loads((tmp_path / "llama_cpp_kwargs.json").read_text())
    assert kw["type_k"] == 8 and kw["flash_attn"] is True and kw["n_ubatch"] == 128
    sh = (tmp_path / "llama-server.sh").read_text()
    assert "-ctk q8_0" in sh and "-fa on" in sh and "-ub 128" in sh
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    again = load_config(best)
    assert compile_space(again).size() == 1
    assert not list(tmp_path.glob(".*.tmp"))


def test_summary_says_when_an_export_cannot_run(tmp_path):
    from autotune.config.compose import compose as _compose

    data = _compose(["conf=local_cpu", f"study.dir={tmp_path}"])
    data["engine"]["variants"]["gone"] = {"path": str(tmp_path / "gone.gguf")}
    data["space"]["model"]["choices"].append("gone")
    cfg = load_config(data)
    space = compile_space(cfg)
    win = Record(2, {"model": "gone", "n_threads": 2}, {"decode_tps": 90.0, "ttft_p95_ms": 120.0})
    write_all(tmp_path, cfg, space, [win], win,
              StudySummary(study="s", engine="llamacpp", interrupted=False, winner=win, warnings=["earlier"]))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["warnings"][0] == "earlier"
    assert any("gone.gguf does not exist" in w for w in summary["warnings"][1:]), summary["warnings"]
