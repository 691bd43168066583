"""The GGUF-header memory estimate vs llama.cpp's own KV sizes and a measured peak RSS."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autotune.engines.llamacpp.gguf_memory import KV_BYTES
from autotune.engines.llamacpp.gguf_memory import _gguf_metadata
from autotune.engines.llamacpp.gguf_memory import _gguf_shape
from autotune.engines.llamacpp.gguf_memory import estimate_llamacpp_mb
from autotune.engines.llamacpp.gguf_memory import gguf_shape
from autotune.engines.llamacpp.gguf_memory import kv_cache_mb
from autotune.engines.llamacpp.gguf_memory import read_gguf_metadata

# llama.cpp 0.3.36 prints "KV buffer size" 1.50 + 7.50 MiB (3 full + 15 SWA layers) at
# n_ctx 512 with f16 K and V, and 12 + 60 MiB at 4096, for gemma-3 270M.
LLAMACPP_KV_MIB = {512: 9.0, 2048: 36.0, 4096: 72.0}


def test_header_metadata(gemma_path):
    meta = read_gguf_metadata(gemma_path)
    assert meta["general.architecture"] == "gemma3"
    assert meta["gemma3.block_count"] == 18
    assert meta["tokenizer.ggml.tokens"] == 262144  # an array is summarised by its length
    shape = gguf_shape(gemma_path)
    assert (shape["n_layers"], shape["n_head_kv"], shape["key_length"]) == (18, 1, 256)
    assert shape["n_vocab"] == 262144


def test_header_is_read_once_per_file_version(gemma_path, tmp_path):
    """The pool of a study predicts thousands of configurations: one header read per file,
    and a changed file is read again."""
    copy = tmp_path / "m.gguf"
    copy.write_bytes(open(gemma_path, "rb").read())
    first = gguf_shape(copy)
    before = _gguf_shape.cache_info()
    first["n_layers"] = -1  # callers get a copy: mutating it does not touch the cache
    assert gguf_shape(copy)["n_layers"] == 18
    assert _gguf_shape.cache_info().hits == before.hits + 1
    with open(copy, "ab") as f:
        f.write(b"\0")  # another size: another version of the file
    gguf_shape(copy)
    assert _gguf_shape.cache_info().misses == before.misses + 1


def test_a_variant_not_made_yet_is_predicted_from_one_read_of_its_base_header(gemma_path, tmp_path,
                                                                             monkeypatch):
    """Issue 43: on a fresh cache bo's pool predicted thousands of configurations of recipe
    variants not made yet, each re-reading the base file's header (gemma-3's 262k-entry
    vocabulary): 230 s of a 743 s study. The header is now read once per file version."""
    from autotune.engines.llamacpp.predict import predict_llamacpp

    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))  # no variant made here
    base = tmp_path / "base.gguf"
    base.write_bytes(gemma_path.read_bytes())
    variants = {"b": {"path": str(base)}, "q8": {"recipe": {"ftype": "Q8_0"}, "base": "b"}}
    before = _gguf_metadata.cache_info()
    preds = [predict_llamacpp({"model": "q8", "n_ctx": n, "type_k": "f16", "type_v": "f16"},
                             {"memory_bandwidth_gbps": 20.0}, variants)
             for n in (512, 1024, 2048) * 100]
    assert _gguf_metadata.cache_info().misses == before.misses + 1, _gguf_metadata.cache_info()
    assert preds[0].need_gb[0] > base.stat().st_size / 2**30  # Q8_0 from Q4_K_M: sized up, not the base
    assert preds[0].decode_tps_upper == preds[300 - 3].decode_tps_upper


@pytest.mark.parametrize(("n_ctx", "mib"), sorted(LLAMACPP_KV_MIB.items()))
def test_kv_matches_llamacpp(gemma_path, n_ctx, mib):
    assert kv_cache_mb(gguf_shape(gemma_path), n_ctx, "f16", "f16") == pytest.approx(mib)


@pytest.mark.parametrize(("type_k", "type_v"), [("q8_0", "q8_0"), ("q4_0", "f16"), ("f32", "f32")])
def test_kv_scales_with_type(gemma_path, type_k, type_v):
    shape = gguf_shape(gemma_path)
    ratio = kv_cache_mb(shape, 512, type_k, type_v) / kv_cache_mb(shape, 512, "f16", "f16")
    assert ratio == pytest.approx((KV_BYTES[type_k] + KV_BYTES[type_v]) / 4)


def test_estimate_parts(gemma_path):
    e = estimate_llamacpp_mb(gemma_path, 512, "f16", "f16")
    assert e["weights_mb"] == pytest.approx(gemma_path.stat().st_size / 2**20)
    assert e["total_mb"] == pytest.approx(
        e["weights_mb"] + e["kv_mb"] + e["logits_mb"] + e["runtime_mb"]
    )
    big = estimate_llamacpp_mb(gemma_path, 512, logits_all=True)
    assert big["logits_mb"] == pytest.approx(2 * 512 * 262144 * 4 / 2**20)
    assert estimate_llamacpp_mb(gemma_path, 0)["n_ctx"] == 32768  # 0 = training context


def test_bad_inputs(gemma_path, tmp_path):
    with pytest.raises(ValueError, match="type_k='q9'"):
        estimate_llamacpp_mb(gemma_path, 512, "q9", "f16")
    bogus = tmp_path / "x.gguf"
    bogus.write_bytes(b"NOPE" + b"\0" * 64)
    with pytest.raises(ValueError, match="not a GGUF"):
        read_gguf_metadata(bogus)


MEASURE = """
import json, sys, llama_cpp
from autotune.engines.llamacpp.gguf_memory import peak_rss_mb
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), n_threads=1,
                      logits_all=sys.argv[3] == "1", verbose=False)
tokens = llm.tokenize(b"The quick brown fox jumps over the lazy dog. " * 10)
for i, _ in enumerate(llm.generate(tokens, top_k=1, temp=0.0)):
    if i >= 8:
        break
print(json.dumps(peak_rss_mb()))
"""


@pytest.mark.slow
@pytest.mark.parametrize(("n_ctx", "logits_all"), [(512, False), (4096, False), (512, True)])
def test_estimate_vs_measured_rss(gemma_path, n_ctx, logits_all):
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(gemma_path), str(n_ctx), "1" if logits_all else "0"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    est = estimate_llamacpp_mb(gemma_path, n_ctx, logits_all=logits_all)["total_mb"]
    if logits_all:
        # an upper bound: logits rows become resident only as positions are evaluated
        assert 1.0 <= est / rss < 3.0, (est, rss)
    else:  # within 25% on this model
        assert 0.75 < est / rss < 1.25, (est, rss)


def test_peak_rss_is_not_inherited_from_the_parent():
    """ru_maxrss survives fork+exec on Linux; peak_rss_mb must report the child's own."""
    import numpy as np

    ballast = np.ones(50_000_000)  # ~400 MB resident in this (parent) process
    assert ballast.sum() > 0
    code = "from autotune.engines.llamacpp.gguf_memory import peak_rss_mb; print(peak_rss_mb())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert float(out.stdout) < 200, out.stdout
