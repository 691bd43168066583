"""bench/surfaces/families.py (issue 41): surface families, their instances and the split."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SURFACES = ROOT / "bench" / "surfaces"
sys.path.insert(0, str(SURFACES))
sys.path.insert(0, str(ROOT / "bench"))

import families  # noqa: E402
from truth import load  # noqa: E402

PARAMS = {"bpw": 3.5, "cache_mode": "FP16", "gpu_split": "tp", "draft_k": 3, "max_seq_len": 4096}


def test_instance_minus_one_is_the_hand_written_surface_and_instances_differ():
    from models import exl2_70b

    assert families.model("exl2_70b")(PARAMS) == exl2_70b(PARAMS)
    draws = [families.model("exl2_70b", i)(PARAMS)["decode_tps"] for i in range(1000, 1010)]
    assert len(set(draws)) == 10 and max(draws) > 1.2 * min(draws)
    assert families.constants("exl2_70b", 1003) == families.constants("exl2_70b", 1003)  # a seed


def test_instances_vary_the_structure_not_only_the_scale():
    """Across 12 tune instances the optimum's draft branch and bpw level both change."""
    shapes = [families.structure(load("exl2_70b", i, launchable=False)) for i in range(1000, 1012)]
    assert {s["draft"] for s in shapes} == {"on", "off"}
    assert len({s["bpw"] for s in shapes}) >= 2
    assert {s["edge"] for s in shapes} <= {"interior", "constraint edge", "crash edge"}


def test_moe_surface_has_a_spill_region_where_decode_collapses():
    import moe

    base = {"quant": "Q6_K", "n_ctx": 16384, "kv_type": "f16", "ubatch": 512, "threads": 8, "flash_attn": True}
    speeds = {}
    for n in range(0, 49, 4):
        try:
            speeds[n] = moe.moe_30b({**base, "n_cpu_moe": n})["decode_tps"]
        except moe.SimFailure:
            speeds[n] = 0.0
    edge = max(speeds, key=speeds.get)  # the least offload that fits in VRAM
    assert speeds[0] == 0.0 and edge > 4  # every expert on the GPU: out of memory
    assert 0 < speeds[edge - 4] < 0.5 * speeds[edge]  # one step less offload: spilled, collapsed
    assert speeds[edge + 4] > 0.6 * speeds[edge]  # one step more: a little slower


def test_moe_surface_reads_vram_as_a_real_box_does():
    """A spill fills what was free at the start (the peak above idle reads it, vram_free_gb beside
    it); an out-of-memory launch fails on the weights buffer with ggml-cuda's line, its size in MiB."""
    import moe

    from autotune.search.memory import oom_need_gb

    base = {"quant": "Q6_K", "n_ctx": 16384, "kv_type": "f16", "ubatch": 512, "threads": 8, "flash_attn": True}
    free = 24.0 - moe.K["margin_gb"]
    reads = {}
    for n in range(0, 49, 4):
        try:
            reads[n] = moe.moe_30b({**base, "n_cpu_moe": n})
        except moe.SimFailure as e:
            reads[n] = str(e)
    spilled = [m for m in reads.values() if isinstance(m, dict) and m["vram_peak_gb"] >= free]
    assert spilled and all(m["vram_free_gb"] == free for m in spilled)
    with pytest.raises(moe.SimFailure) as e:  # Q8_0, every expert on the GPU: its 30.3 GB weights fail first
        moe.moe_30b({**base, "quant": "Q8_0", "n_cpu_moe": 0})
    assert oom_need_gb(str(e.value)) == pytest.approx(moe.MOE_GB["Q8_0"], abs=0.01)
    # Q6_K's 23.4 GB of weights still fit (spilling); the KV cache after them fails, and names only itself
    assert oom_need_gb(reads[0]) < 2.0


@pytest.mark.parametrize("mode", ["none", "physics", "misleading"])
def test_moe_preset_composes_in_the_three_prior_modes_with_an_instance(mode):
    import efficiency

    from autotune.cli.main import prepare

    truth = types.SimpleNamespace(name="moe_30b", instance=1004)
    cfg, space, base = prepare(efficiency.overrides(truth, "default", mode, 1004, 20), str(SURFACES), dry_run=True)
    assert cfg.engine.settings["vars"]["instance"] == 1004
    upper = space.engine.predict(base, cfg.engine.settings, cfg.engine.variants).decode_tps_upper
    assert (upper is None) == (mode == "none")


def test_prior_blocks_hold_no_drawn_constant():
    """The physics prior is static text: an instance's draws never reach it."""
    import yaml

    for name in families.FAMILIES:
        text = yaml.dump(yaml.safe_load((SURFACES / f"{name}.yaml").read_text())["engine"]["settings"]["predict"])
        for i in (1000, 5000):
            for k, v in families.constants(name, i).items():
                if isinstance(v, float) and v not in (0.0, 1.0):
                    assert f"{v:.6g}" not in text, (name, k)


def test_sim_runs_an_instance_with_its_own_noise():
    import sim

    params = {**PARAMS}
    a = sim.measure("exl2_70b", params, "/s/trials/0001", 0.03, 1000, instance=1000)
    b = sim.measure("exl2_70b", params, "/s/trials/0001", 0.03, 1000, instance=1001)
    c = sim.measure("exl2_70b", params, "/s/trials/0001", 0.03, 1000)
    assert len({a["decode_tps"], b["decode_tps"], c["decode_tps"]}) == 3


def test_split_seeds_are_disjoint_and_labelled():
    import instances

    assert not set(instances.SPLITS["tune"]) & set(instances.SPLITS["report"])
    assert instances.split_of(1000) == "i-tune" and instances.split_of(5000) == "i-held"
    assert instances.decile([1.0] * 9 + [0.2]) == 0.2 and instances.decile([1.0, 0.5]) == 0.5


def test_family_smoke_mode_tables_every_family():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "efficiency.py"), "--smoke", "--families", "all",
                          "--trials", "20"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    for name in families.FAMILIES:
        assert f"{name} (3 instances)" in out.stdout
    assert "worst10%@20" in out.stdout


def test_family_rows_score_each_family_and_leave_out_unscored_instances(tmp_path):
    import efficiency
    import instances

    def run(seed, last, method="default"):
        return efficiency.Run("moe_30b", method, seed, 0, 0.0, (0.5,) * 19 + (last,), None, mode="none", via="fast")

    runs = [run(5000 + i, v) for i, v in enumerate([0.99, 0.96, 0.9, 0.97, 0.2, 0.99, 0.98, 0.97, 0.99, 0.96])]
    runs.append(efficiency.Run("moe_30b", "default", 5010, 0, 0.0, (), None, "no feasible configuration", "none", "fast"))
    (row,) = instances.family_rows(runs)
    assert (row["set"], row["n"], row["hits"]) == ("i-held", 10, 8)
    assert row["worst10"] == 0.2 and row["median"] == pytest.approx(0.97) and row["trials95"] == 20
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(__import__("json").dumps(__import__("dataclasses").asdict(r)) + "\n" for r in runs))
    assert efficiency.main(["--merge", str(path), "--results", str(tmp_path / "out")]) == 0
    assert "8/10 80%" in (tmp_path / "out.txt").read_text()
