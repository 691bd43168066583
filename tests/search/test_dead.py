"""Dead levels (issue 41): a level that failed every launch holding it leaves the candidates
(autotune.search.dead; off by default)."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.config.schema import load_config
from autotune.config.validate import compile_space
from autotune.search import dead


def _space():
    return compile_space(load_config({
        "engine": {"kind": "command", "settings": {
            "argv": ["x", "{ctx}"],
            "knobs": {"ctx": {"type": "int", "low": 1024, "high": 65536},
                      "mem": {"type": "int", "low": 0, "high": 40}},
            "defaults": {"ctx": 8192, "mem": 0}}},
        "space": {"ctx": {"type": "categorical", "choices": [4096, 8192, 16384], "ordered": True},
                  "mem": {"type": "int", "low": 0, "high": 40, "step": 2}},
        "objectives": ["decode_tps"],
        "quality": {"enabled": False},
    }))


def test_a_level_that_failed_twice_and_never_ran_is_dead_and_leaves_the_candidates():
    space = _space()
    launched = [({"ctx": 4096, "mem": 0}, False, "no KV slot"), ({"ctx": 4096, "mem": 20}, False, "no KV slot"),
                ({"ctx": 8192, "mem": 0}, False, "no KV slot"), ({"ctx": 8192, "mem": 20}, True, ""),
                ({"ctx": 16384, "mem": 40}, False, "no KV slot")]
    found = dead.levels(space, launched)
    # 8192 ran once, 16384 failed once only; mem 0 failed twice, but mem's 21 values are no levels
    assert found == {("ctx", 4096)}
    params = [{"ctx": 4096, "mem": 10}, {"ctx": 8192, "mem": 10}, {"ctx": 16384, "mem": 10}]
    assert dead.prune(np.array([0, 1, 2]), params, found).tolist() == [1, 2]
    assert dead.prune(np.array([0]), params, found).tolist() == [0]  # nothing else left: kept



def _config():
    return load_config({
        "engine": {"kind": "command", "settings": {
            "argv": ["x", "{ctx}"],
            "knobs": {"ctx": {"type": "int", "low": 1024, "high": 65536},
                      "mem": {"type": "int", "low": 0, "high": 40},
                      "a": {"type": "int", "low": 1, "high": 8}, "b": {"type": "int", "low": 1, "high": 8}},
            "defaults": {"ctx": 8192, "mem": 0, "a": 1, "b": 1}}},
        "space": {"ctx": {"type": "categorical", "choices": [4096, 8192, 16384, 32768], "ordered": True},
                  "mem": {"type": "int", "low": 0, "high": 40, "step": 2},
                  "a": {"type": "categorical", "choices": [1, 2, 4, 8]},
                  "b": {"type": "categorical", "choices": [1, 2, 4, 8]}},
        "objectives": ["decode_tps"],
        "quality": {"enabled": False},
    })


def _run(p: dict, number: int):
    """The shortest context never runs (too short for the prompt); the speed rises as ctx falls,
    so a model that blurs the failures over the other knobs keeps asking for ctx 4096."""
    from autotune.trial.spec import TrialResult

    if p["ctx"] == 4096:
        return TrialResult(number, "failed", reason="failed to find a KV slot")
    return TrialResult(number, "ok", {"decode_tps": 100.0 + 0.2 * p["mem"] + 4000 * 1024 / p["ctx"]
                                      + p["a"] - p["b"]})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bo_never_asks_for_a_dead_level_again(monkeypatch, seed):
    """Two launches at ctx 4096 failed (other knobs apart), nothing at 4096 ever ran: no later
    ask holds it, though the speed rises toward it."""
    import optuna

    from autotune.record import optuna_study as studylib
    from autotune.search.bo import PoolSampler
    from autotune.search.pool import build_pool

    monkeypatch.setattr(dead, "DEAD", True)
    cfg = _config()
    space = compile_space(cfg)
    sampler = PoolSampler(space, lambda: build_pool(space, lambda p: (True, None), seed), cfg.constraints,
                          seed, 3, objectives=studylib.told_names(cfg))
    study = optuna.create_study(directions=studylib.directions(cfg), sampler=sampler)
    fixed = [{"ctx": 4096, "mem": 40, "a": 1, "b": 8}, {"ctx": 4096, "mem": 0, "a": 8, "b": 1},
             {"ctx": 8192, "mem": 10, "a": 2, "b": 2}, {"ctx": 32768, "mem": 30, "a": 4, "b": 4}]
    asked = []
    for i in range(12):
        if i < len(fixed):
            study.enqueue_trial(fixed[i])
        trial = study.ask()
        p = space.suggest(trial)
        studylib.tell(study, trial, cfg, p, _run(p, trial.number))
        asked.append(p)
    assert all(p["ctx"] != 4096 for p in asked[len(fixed):]), asked


def test_with_kind_out_of_memory_failures_do_not_kill_a_level(monkeypatch):
    """A level that ran out of memory twice may fit with other knobs: with ``KIND`` only the
    failures that do not read as out of memory count."""
    space = _space()
    oom = "cudaMalloc failed: out of memory"
    launched = [({"ctx": 16384, "mem": 0}, False, oom), ({"ctx": 16384, "mem": 2}, False, oom),
                ({"ctx": 4096, "mem": 0}, False, "failed to find a KV slot"),
                ({"ctx": 4096, "mem": 2}, False, "failed to find a KV slot")]
    assert dead.levels(space, launched) == {("ctx", 16384), ("ctx", 4096)}
    monkeypatch.setattr(dead, "KIND", True)
    assert dead.levels(space, launched) == {("ctx", 4096)}
