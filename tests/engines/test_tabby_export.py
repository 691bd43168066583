"""The TabbyAPI exports, checked against TabbyAPI's own sample configs and config models.

``tests/data/tabbyapi_config_sample.exl2-checkpoint.yml`` is a verbatim copy of
config_sample.yml from the exl2-checkpoint branch (the last that drives exllamav2): every key
we write must exist in the same section there, with a value of the same kind.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotune.engines.exllamav2.engine import ExLlamaV2Engine
from autotune.engines.exllamav2.engine import tabby_config
from autotune.engines.exllamav2.engine import tabby_warnings

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "tabbyapi_config_sample.exl2-checkpoint.yml"
HYDRA = {"gpus": [{"name": "RTX 5090", "memory_gb": 32}, {"name": "RTX 4090", "memory_gb": 24}]}
VARIANTS = {"l70": {"path": "/models/Llama-3.1-70B-exl2-4.0bpw", "bpw": 4.0},
            "draft": {"path": "/drafts/Llama-3.2-1B-exl2", "bpw": 4.0}}
CACHE_MODES = {"FP16", "Q8", "Q6", "Q4"}  # sample comment: "Possible values for exllamav2"


def sample() -> dict:
    return yaml.safe_load(SAMPLE.read_text())


def export(tmp_path: Path, **kw) -> tuple[dict, str, list[Path]]:
    p = {"model": "l70", **kw}
    files = ExLlamaV2Engine.export(p, HYDRA, VARIANTS, tmp_path)
    text = files[0].read_text()
    return yaml.safe_load(text), text, files


def _same_kind(ours, theirs) -> bool:
    if theirs is None or ours is None:  # an empty key in the sample means "optional"
        return True
    if isinstance(theirs, bool):
        return isinstance(ours, bool)
    if isinstance(theirs, (int, float)):
        return isinstance(ours, (int, float)) and not isinstance(ours, bool)
    return isinstance(ours, type(theirs))


CASES = [
    {},
    {"gpu_split": "tp", "cache_mode": "Q6"},
    {"gpu_split": "30,22", "cache_mode": "Q4", "max_seq_len": 16384, "chunk_size": 4096},
    {"draft_model": "draft", "num_draft_tokens": 4, "draft_cache_mode": "Q8", "max_batch_size": 8},
]


@pytest.mark.parametrize("kw", CASES)
def test_every_key_exists_in_the_sample_with_the_same_kind(tmp_path: Path, kw: dict) -> None:
    ours, _, _ = export(tmp_path, **kw)
    ref = sample()
    for section, values in ours.items():
        assert section in ref, f"section {section} is not in TabbyAPI's sample"
        for key, value in values.items():
            assert key in ref[section], f"{section}.{key} is not a TabbyAPI key"
            assert _same_kind(value, ref[section][key]), f"{section}.{key}={value!r} vs {ref[section][key]!r}"


@pytest.mark.parametrize("kw", CASES)
def test_values_are_allowed(tmp_path: Path, kw: dict) -> None:
    ours, _, _ = export(tmp_path, **kw)
    m, d = ours["model"], ours["draft_model"]
    assert ours["network"]["host"] == "127.0.0.1"
    assert m["backend"] == "exllamav2"
    assert m["cache_mode"] in CACHE_MODES and d["draft_cache_mode"] in CACHE_MODES
    assert m["cache_size"] % 256 == 0 and m["cache_size"] >= m["max_seq_len"]
    assert all(isinstance(x, (int, float)) for x in m["gpu_split"] + m["autosplit_reserve"])
    assert (m["model_dir"], m["model_name"]) == ("/models", "Llama-3.1-70B-exl2-4.0bpw")
    assert m["chunk_size"] % 256 == 0


def test_split_modes_map_to_tabby_switches(tmp_path: Path) -> None:
    auto = export(tmp_path, gpu_split="auto")[0]["model"]
    assert (auto["gpu_split_auto"], auto["tensor_parallel"], auto["gpu_split"]) == (True, False, [])
    tp = export(tmp_path, gpu_split="tp")[0]["model"]
    assert (tp["gpu_split_auto"], tp["tensor_parallel"], tp["gpu_split"]) == (False, True, [])
    manual = export(tmp_path, gpu_split="30,22")[0]["model"]
    assert (manual["gpu_split_auto"], manual["tensor_parallel"], manual["gpu_split"]) == (False, False, [30.0, 22.0])


def test_draft_section(tmp_path: Path) -> None:
    none = export(tmp_path)[0]["draft_model"]
    assert none["draft_model_name"] is None and none["draft_num_tokens"] is None
    d = export(tmp_path, draft_model="draft", num_draft_tokens=4, draft_cache_mode="Q8")[0]["draft_model"]
    assert (d["draft_model_dir"], d["draft_model_name"]) == ("/drafts", "Llama-3.2-1B-exl2")
    assert (d["draft_cache_mode"], d["draft_gpu_split"], d["draft_num_tokens"]) == ("Q8", [], 4)


def test_k_other_than_4_is_flagged_plainly(tmp_path: Path) -> None:
    _, text, files = export(tmp_path, draft_model="draft", num_draft_tokens=6)
    assert text.startswith("#")
    assert "# WARNING: num_draft_tokens=6 was tuned, but TabbyAPI's exllamav2 backend ignores" in text
    assert [f.name for f in files] == ["tabbyapi.yml", "tabbyapi_warnings.txt"]
    assert "always drafts 4 tokens" in files[1].read_text()
    _, text4, files4 = export(tmp_path / "k4", draft_model="draft", num_draft_tokens=4)
    assert "WARNING" not in text4 and len(files4) == 1


def test_layer_skipping_is_flagged(tmp_path: Path) -> None:
    _, text, files = export(tmp_path, layer_skip_threshold=0.98)
    assert "layer skipping is not a TabbyAPI option" in text
    assert tabby_warnings({"layer_skip_threshold": 1.0}) == []


def test_config_is_loadable_by_tabby_style_merge(tmp_path: Path) -> None:
    """Overlaying our sections on the sample leaves a config with the sample's structure."""
    ref = sample()
    ours = tabby_config({"model": "l70", **ExLlamaV2Engine.default_params(HYDRA, VARIANTS)}, HYDRA, VARIANTS)
    merged = {k: {**ref[k], **ours.get(k, {})} for k in ref}
    assert set(merged) == set(ref) and all(set(merged[k]) == set(ref[k]) for k in ref)


# ---- every configuration of each preset's space validates against its branch's model ----------
def _space_configurations(preset: str):
    """(space, every distinct active configuration of the preset's space, the engine's settings)."""
    import itertools

    from autotune.config.compose import compose
    from autotune.config.schema import load_config
    from autotune.config.validate import compile_space

    cfg = load_config(compose([f"conf={preset}"]))
    space = compile_space(cfg)
    dims = [(p.name, p.values()) for p in space.params.values()]
    assert all(v is not None for _, v in dims), "a continuous dimension cannot be enumerated"
    seen: dict[tuple, dict] = {}
    for combo in itertools.product(*(v for _, v in dims)):
        params = space.restrict(dict(zip((n for n, _ in dims), combo)))
        seen.setdefault(tuple(sorted(params.items())), params)
    return space, list(seen.values()), dict(cfg.engine.settings), dict(cfg.engine.variants)


@pytest.mark.parametrize(("preset", "branch", "backend"), [
    ("hydra_cluster", "exl2-checkpoint", "exllamav2"),
    ("hydra_cluster_exl3", "main", "exllamav3"),
])
def test_every_configuration_of_the_preset_validates_against_its_branch(preset: str, branch: str,
                                                                        backend: str) -> None:
    from autotune.engines.tabbyapi.check import branch_of
    from autotune.engines.tabbyapi.check import validate

    space, configs, settings, variants = _space_configurations(preset)
    engine = space.engine
    plan = __import__(f"autotune.engines.{backend}.plan", fromlist=["tabby_config"])
    checked = 0
    for params in configs:
        if space.violations(params):  # refused before launch: never a winner
            continue
        doc = plan.tabby_config(engine.full_params(params, settings, variants), settings, variants)
        assert doc["model"]["backend"] == backend and branch_of(doc) == branch
        problems = validate(doc, branch)
        assert problems == [], (params, problems)
        checked += 1
    assert checked > 1000, checked


def test_each_export_validates_only_against_its_own_branch(tmp_path: Path) -> None:
    """The exl2 form is refused by main (exllamav2 backend); main's k,v cache is fine on main."""
    from autotune.engines.exllamav3.engine import ExLlamaV3Engine
    from autotune.engines.tabbyapi.check import validate

    exl2 = export(tmp_path / "a")[0]
    assert validate(exl2, "exl2-checkpoint") == []
    assert any("exllamav3 only" in p for p in validate(exl2, "main"))
    v3 = {"l70": {"path": "/models/Llama-3.1-70B-exl3-4.0bpw", "bpw": 4.0}}
    (f, *_) = ExLlamaV3Engine.export({"model": "l70", "cache_mode": "8,4"}, HYDRA, v3, tmp_path / "b")
    assert validate(yaml.safe_load(f.read_text()), "main") == []


def test_what_tabbyapi_cannot_represent_is_in_the_file_and_the_warnings(tmp_path: Path) -> None:
    from autotune.engines.exllamav3.engine import ExLlamaV3Engine

    _, text, files = export(tmp_path / "skip", layer_skip_threshold=0.98, draft_model="draft", num_draft_tokens=6)
    warnings = tabby_warnings({"model": "l70", "layer_skip_threshold": 0.98,
                               "draft_model": "draft", "num_draft_tokens": 6}, HYDRA)
    assert set(warnings) <= set(ExLlamaV2Engine.export_warnings(
        {"model": "l70", "layer_skip_threshold": 0.98, "draft_model": "draft", "num_draft_tokens": 6}, HYDRA))
    assert any("layer skipping is not a TabbyAPI option" in w for w in warnings)
    assert any("always drafts 4 tokens" in w for w in warnings)
    assert all(f"# WARNING: {w}" in text for w in warnings)
    v3 = {"l70": {"path": "/models/Llama-3.1-70B-exl3-4.0bpw", "bpw": 4.0}}
    one = {"gpus": [{"name": "RTX 4090", "memory_gb": 24}]}
    files = ExLlamaV3Engine.export({"model": "l70", "gpu_split": "20"}, one, v3, tmp_path / "v3")
    text3 = files[0].read_text()
    assert "# WARNING: TabbyAPI ignores gpu_split and tensor_parallel with a single GPU." in text3
    assert "engine tabbyapi" in files[1].read_text()
