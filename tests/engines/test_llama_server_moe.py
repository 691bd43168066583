"""MoE expert placement on llama-server: the knobs, the tensor table, the prediction, a real start.

The tiny MoE (``tiny_moe``: 4 layers, 8 experts, 2 active) is written here with the ``gguf``
package; the 30B-A3B-shaped file (``a3b_header``) is a tensor table with no weights. The
prediction is checked against byte counts taken independently: gguf's own ``GGUFReader`` for
the tiny file, the shapes and ggml block sizes by hand for the 30B-A3B.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from autotune.engines.llama_server.engine import LlamaServerEngine
from autotune.engines.llama_server.engine import server_argv
from autotune.engines.llama_server.knobs import KNOBS
from autotune.engines.llama_server.knobs import SPEC_TYPES
from autotune.engines.llama_server.knobs import placement_override
from autotune.engines.llama_server.predict import predict_llama_server
from autotune.engines.llamacpp.gguf_memory import read_gguf_tensors
from autotune.engines.llamacpp.moe import gpu_of_layers
from autotune.engines.llamacpp.moe import layer_table
from autotune.engines.llamacpp.moe import place
from autotune.engines.llamacpp.server_flags import argv_reasons
from autotune.engines.llamacpp.server_flags import load as load_flag_table
from autotune.engines.predict import GIB
from autotune.engines.predict import GPU_OVERHEAD_GB
from autotune.errors import InfeasibleConfig

GPU = {"name": "RTX 4090", "memory_gb": 24, "bandwidth_gbps": 1008}
RAM_GBPS = 80.0


def settings(*gpus: dict) -> dict:
    return {"gpus": [dict(g) for g in gpus], "memory_bandwidth_gbps": RAM_GBPS}


def predict(path: Path, s: dict, **params):
    variants = {"m": {"path": str(path)}}
    full = LlamaServerEngine.full_params({"model": "m", **params}, s, variants)
    return predict_llama_server(full, s, variants)


# ---- knobs: pure --------------------------------------------------------------------------
def test_placements_render_to_patterns_that_name_exactly_their_experts(tiny_moe: Path) -> None:
    names = list(read_gguf_tensors(tiny_moe))

    def moved(placement: str) -> set[str]:
        pattern = placement_override(placement, 4).removesuffix("=CPU")
        return {n for n in names if re.search(pattern, n)}  # llama.cpp: std::regex_search

    exps = {n for n in names if "_exps." in n}
    assert moved("exps_odd") == {n for n in exps if n.split(".")[1] in ("1", "3")}
    assert moved("exps_up_down") == {n for n in exps if "gate" not in n}
    assert moved("exps_last_2") == {n for n in exps if n.split(".")[1] in ("2", "3")}
    assert moved("exps_last_9") == exps and placement_override("exps_last_0", 4) is None
    assert placement_override("none", 4) is None


def test_the_new_flags_are_in_the_flag_table_and_bad_values_are_named() -> None:
    table = load_flag_table()
    assert set(SPEC_TYPES) == set(table.values["spec_types"])  # --spec-type's own list
    params = {"n_cpu_moe": 3, "cpu_moe": True, "override_tensor": "exps_odd",
              "tensor_split": "3,1", "split_mode": "row", "main_gpu": 1, "fit": "off",
              "fit_target": 2048, "spec_type": "ngram-simple,ngram-mod", "spec_draft_p_min": 0.8}
    argv = server_argv("llama-server", "/m.gguf", params, 8080)
    assert argv_reasons(argv) == [], argv
    assert "--cpu-moe" in argv
    assert "--no-cpu-moe" not in server_argv("x", "m", {"cpu_moe": False}, 1)
    bad = LlamaServerEngine.check({"override_tensor": "exps_first_2", "tensor_split": "3:1",
                                   "n_cpu_moe": -1, "spec_type": "ngram", "fit": "auto"}, {})
    assert bad == [
        "override_tensor='exps_first_2' is not one of none, exps_odd, exps_up_down or "
        "exps_last_<N>",
        "tensor_split='3:1' is not comma-separated proportions per GPU, e.g. 3,1 (empty: by "
        "free memory)",
        "n_cpu_moe=-1 is not an int in [0, 4096]",
        "spec_type='ngram' is not " + KNOBS["spec_type"].allowed(),
        "fit='auto' is not one of on, off",
    ]


def test_the_last_layers_are_read_from_the_model_file(tiny_moe: Path) -> None:
    variants = {"m": {"path": str(tiny_moe)}}
    argv = LlamaServerEngine.argv_for({"model": "m", "override_tensor": "exps_last_1"}, {},
                                      variants, 8080, binary="llama-server")
    assert r"blk\.(3)\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU" in argv
    dry = LlamaServerEngine.describe_launch({"model": "m", "override_tensor": "exps_last_1"}, {},
                                            {"m": {"path": "/not/made/yet.gguf"}})
    assert "<last 1>" in dry


# ---- the tensor table and the prediction -------------------------------------------------
@pytest.mark.parametrize(
    ("ngl", "n_gpus", "split", "mode", "devices"),
    [
        (2, 1, [], "layer", [0, 0, 0, 1, 1]),  # the last ngl of the 5 "layers" (head last)
        (-1, 2, [], "layer", [1, 1, 1, 2, 2]),  # by layer count: upper_bound of i/5 in [.5, 1]
        (-1, 2, [3, 1], "layer", [1, 1, 1, 1, 2]),
        (-1, 2, [], "none", [1, 1, 1, 1, 1]),  # main_gpu 0 holds every layer
        (-1, 0, [], "layer", [0, 0, 0, 0, 0]),  # no GPU: everything in RAM
        (0, 1, [], "layer", [0, 0, 0, 0, 0]),
    ],
)
def test_layers_go_to_devices_as_llama_cpp_places_them(ngl, n_gpus, split, mode, devices) -> None:
    assert gpu_of_layers(4, ngl, n_gpus, split, mode) == devices


def test_the_tensor_table_is_gguf_readers(tiny_moe: Path) -> None:
    from gguf import GGUFReader

    ours = read_gguf_tensors(tiny_moe)
    theirs = {t.name: int(t.n_bytes) for t in GGUFReader(tiny_moe).tensors}
    assert ours == theirs and len(ours) == 1 + 4 * 10 + 2
    t = layer_table(tiny_moe)
    assert t["moe"] and t["n_expert"] == 8 and t["n_expert_used"] == 2 and not t["tied"]
    assert sum(t["dense"]) + sum(t["experts"]) + t["embd"] + t["output"] == sum(theirs.values())


@pytest.mark.parametrize("n_cpu_moe", [0, 1, 2, 4])
def test_tiny_moe_ram_and_vram_match_the_tensor_table(tiny_moe: Path, n_cpu_moe: int) -> None:
    from gguf import GGUFReader

    from autotune.engines.llamacpp.gguf_memory import estimate_llamacpp_mb

    sizes = {t.name: int(t.n_bytes) for t in GGUFReader(tiny_moe).tensors}
    in_ram = {n for n in sizes if n.startswith("token_embd")
              or ("_exps." in n and int(n.split(".")[1]) < n_cpu_moe)}
    ram_bytes = sum(sizes[n] for n in in_ram)
    gpu_bytes = sum(sizes.values()) - ram_bytes
    est = estimate_llamacpp_mb(tiny_moe, 0)  # ctx 0: the model's, as the server
    want_gpu = (gpu_bytes / GIB + est["kv_mb"] / 1024 + GPU_OVERHEAD_GB
                + est["compute_reserved_mb"] / 1024)
    want_ram = ram_bytes / GIB + (est["logits_mb"] + est["runtime_mb"]) / 1024
    pred = predict(tiny_moe, settings(GPU), n_cpu_moe=n_cpu_moe)
    assert pred.need_gb[1] == pytest.approx(want_gpu, rel=0.02, abs=1e-3)
    assert pred.need_gb[0] == pytest.approx(want_ram, rel=0.02, abs=1e-3)
    held = place(layer_table(tiny_moe), {"n_gpu_layers": -1, "n_cpu_moe": n_cpu_moe}, 1)["held"]
    assert held == [ram_bytes, gpu_bytes]  # the bytes themselves: exact


def test_a_30b_a3b_header_is_sized_as_its_shape(a3b_header: Path) -> None:
    q4k, q6k = 144 / 256, 210 / 256  # ggml block bytes per weight
    experts = 128 * 768 * 2048 * (2 * q4k + q6k)  # gate, up, down of one layer
    attn = 2048 * (32 * 128 * 2 + 4 * 128 * 2) * q4k
    norms = (2 * 2048 + 2 * 128 + 2048 * 128) * 4  # attn/ffn norms, q/k norms, the router (f32)
    embd, head = 151936 * 2048 * q4k, 151936 * 2048 * q6k + 2048 * 4
    t = layer_table(a3b_header)
    assert t["experts"][0] == pytest.approx(experts, rel=0.02)
    assert t["dense"][0] == pytest.approx(attn + norms, rel=0.02)
    kv = 48 * 40960 * 4 * 128 * 2 * 2 / GIB  # f16 K and V at the trained context
    kv += 512 * 151936 * 4 / GIB  # and the compute buffer's logits of a 512-token ubatch
    for n, on_gpu in ((0, 48), (24, 24), (48, 0)):
        pred = predict(a3b_header, settings(GPU), n_cpu_moe=n)
        gpu = (48 * (attn + norms) + on_gpu * experts + head) / GIB + kv + GPU_OVERHEAD_GB
        ram = ((48 - on_gpu) * experts + embd) / GIB
        assert pred.need_gb[1] == pytest.approx(gpu, rel=0.02), n
        assert pred.need_gb[0] == pytest.approx(ram, rel=0.02, abs=0.25), n  # + logits, runtime
    total = sum(t["experts"] + t["dense"]) / GIB + (embd + head) / GIB
    assert 17.0 < total < 19.5  # a real Q4_K_M file is about 18.6 GB
    # 16 GB card: every expert on the GPU does not fit, all of them in RAM does
    small = dict(GPU, memory_gb=16)
    assert predict(a3b_header, settings(small)).fits is False
    assert predict(a3b_header, settings(small), n_cpu_moe=48).fits is not False


def test_the_decode_bound_counts_active_experts_where_they_sit(a3b_header: Path) -> None:
    t = layer_table(a3b_header)
    s = settings(GPU)
    bounds = [predict(a3b_header, s, n_cpu_moe=n).decode_tps_upper for n in (0, 12, 24, 48)]
    assert bounds == sorted(bounds, reverse=True)  # each layer's experts moved to RAM costs speed
    read = place(t, {"n_gpu_layers": -1, "cpu_moe": True}, 1)["read"]
    assert read[0] == pytest.approx(sum(t["experts"]) * 8 / 128)  # 8 of 128 experts per token
    want = 1 / (read[0] / (RAM_GBPS * 1e9) + read[1] / (GPU["bandwidth_gbps"] * 1e9))
    assert predict(a3b_header, s, cpu_moe=True).decode_tps_upper == pytest.approx(want)


def test_n_cpu_moe_strands_the_first_card_and_a_byte_split_evens_it(a3b_header: Path) -> None:
    """--n-cpu-moe strips the first layers, the default split counts layers: card 0 sits nearly
    empty; a tensor_split weighted to card 0 evens the two."""
    s = settings(GPU, GPU)
    even = predict(a3b_header, s, n_cpu_moe=20)
    assert even.need_gb[1] < 0.6 * even.need_gb[2], even.need_gb
    weighted = predict(a3b_header, s, n_cpu_moe=20, tensor_split="2,1")
    assert abs(weighted.need_gb[1] - weighted.need_gb[2]) < abs(even.need_gb[1] - even.need_gb[2])
    one = predict(a3b_header, s, n_cpu_moe=20, split_mode="none", main_gpu=1)
    assert one.need_gb[1] == 0 and one.need_gb[2] > even.need_gb[2]


def test_a_dense_model_keeps_the_file_size_prediction(gemma_path: Path) -> None:
    assert not layer_table(gemma_path)["moe"]
    assert predict(gemma_path, settings()).need_gb[0] > 0


# ---- the real server ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("params", [
    {"n_cpu_moe": 2, "override_tensor": "exps_last_1", "tensor_split": "1", "split_mode": "none",
     "main_gpu": 1, "fit": "off", "fit_target": 512, "fit_ctx": 1024},
    {"cpu_moe": True, "override_tensor": "exps_odd", "spec_type": "ngram-simple",
     "spec_ngram_simple_size_n": 2, "spec_ngram_simple_size_m": 4, "spec_ngram_simple_min_hits": 2,
     "spec_draft_n_max": 4, "spec_draft_p_min": 0.5},
    {"override_tensor": "exps_up_down", "spec_type": "ngram-mod", "spec_ngram_mod_n_match": 4,
     "spec_ngram_mod_n_min": 1, "spec_ngram_mod_n_max": 8},
])
def test_the_real_server_serves_the_tiny_moe_with_the_new_flags(
        binary: Path, tiny_moe: Path, tmp_path: Path, params: dict) -> None:
    variants = {"m": {"path": str(tiny_moe)}}
    s = {"ctx_size": 512, "parallel": 1, "threads": 1}
    engine = LlamaServerEngine(s, variants, {"model": "m", **params}, tmp_path / "t")
    try:
        engine.start()
        argv = shlex.join(engine.info["server_argv"])
        for knob in params:
            assert LlamaServerEngine.knobs[knob].spelling.split()[0] in argv, (knob, argv)
        gen = engine.generate("the the the the the the", 8)
        assert gen.output_tokens == 8
        log = engine.log_path.read_text(errors="replace")
        assert "tensor overrides to CPU are used" in log, log[-2000:]  # the experts' placement
    finally:
        engine.stop()


@pytest.mark.slow
@pytest.mark.parametrize(("params", "refused"), [
    ({"cache_type_v": "q8_0"}, "V cache type q8_0 (blocks of 32) does not divide this model's head size 16"),
    ({"cache_type_k": "q4_0", "flash_attn": "on"}, "K cache type q4_0 (blocks of 32)"),
    ({"cache_type_k": "q8_0", "flash_attn": "off"}, None),  # no block rule without flash attention
])
def test_a_kv_type_the_heads_cannot_take_is_refused_before_launch_as_the_server_refuses_it(
        binary: Path, tiny_moe: Path, tmp_path: Path, params: dict, refused: str | None) -> None:
    """The tiny MoE's heads are 16 wide; llama.cpp's quantized KV blocks are 32 (seen in a
    newcomer's `init` + `run` on it: every q8_0 trial failed and was filed as out of memory)."""
    from autotune.search.memory import is_oom

    variants = {"m": {"path": str(tiny_moe)}}
    pred = LlamaServerEngine.predict({"model": "m", **params}, {}, variants)
    assert (pred.fits is False) == (refused is not None) and (refused or "") in pred.reason
    engine = LlamaServerEngine({"ctx_size": 512, "parallel": 1, "threads": 1}, variants,
                               {"model": "m", **params}, tmp_path / "t")
    try:
        if refused is None:
            engine.start()
            assert engine.generate("the the the", 4).output_tokens == 4
        else:
            with pytest.raises(InfeasibleConfig) as err:
                engine.start()
            assert "refused the configuration" in str(err.value) and "does not divide" in str(err.value)
            assert not is_oom(str(err.value))
    finally:
        engine.stop()
