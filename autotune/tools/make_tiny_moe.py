"""Write a Mixture-of-Experts GGUF with the ``gguf`` package, offline and deterministic.

Two uses::

    python -m autotune.tools.make_tiny_moe OUT.gguf              # a tiny model llama-server serves
    python -m autotune.tools.make_tiny_moe OUT.gguf --shape 30b-a3b  # a header only (no weights)

The tiny model is a Mixtral-style ``llama`` architecture (4 layers, 8 experts of which 2 are
active, hidden size 64) with random weights and a byte-level SentencePiece vocabulary
(``<unk> <s> </s>`` and the 256 byte tokens): it exists to start llama-server with the expert
flags, not to produce sensible text. The ``30b-a3b`` shape is the tensor table of a
Qwen3-30B-A3B at Q4_K_M-like types (48 layers, 128 experts of which 8 are active), written
with no tensor data: a few KiB whose header the prediction reads as it reads the real file.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

# arch, layers, hidden, expert ff, experts, active, heads, kv heads, head dim, vocab, types
SHAPES = {
    "tiny": {"arch": "llama", "n_layers": 4, "n_embd": 64, "n_ff": 128, "n_expert": 8,
             "n_used": 2, "n_head": 4, "n_head_kv": 2, "head_dim": 16, "n_vocab": 259,
             "ctx": 2048, "types": {"matrix": "F16", "exps": "F16", "down_exps": "F16",
                                    "embd": "F16", "output": "F16"}},
    "30b-a3b": {"arch": "qwen3moe", "n_layers": 48, "n_embd": 2048, "n_ff": 768, "n_expert": 128,
                "n_used": 8, "n_head": 32, "n_head_kv": 4, "head_dim": 128, "n_vocab": 151936,
                "ctx": 40960, "types": {"matrix": "Q4_K", "exps": "Q4_K", "down_exps": "Q6_K",
                                        "embd": "Q4_K", "output": "Q6_K"}},
}


def tensor_shapes(s: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ggml dims (fastest first), type name) of every tensor of shape ``s``."""
    e, ff, n, v = s["n_embd"], s["n_ff"], s["n_expert"], s["n_vocab"]
    q, kv, t = s["n_head"] * s["head_dim"], s["n_head_kv"] * s["head_dim"], s["types"]
    out = [("token_embd.weight", (e, v), t["embd"])]
    for i in range(s["n_layers"]):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (e,), "F32"), (b + "attn_q.weight", (e, q), t["matrix"]),
                (b + "attn_k.weight", (e, kv), t["matrix"]),
                (b + "attn_v.weight", (e, kv), t["matrix"]),
                (b + "attn_output.weight", (q, e), t["matrix"]),
                (b + "ffn_norm.weight", (e,), "F32"),
                (b + "ffn_gate_inp.weight", (e, n), "F32"),
                (b + "ffn_gate_exps.weight", (e, ff, n), t["exps"]),
                (b + "ffn_up_exps.weight", (e, ff, n), t["exps"]),
                (b + "ffn_down_exps.weight", (ff, e, n), t["down_exps"])]
        if s["arch"] == "qwen3moe":
            out += [(b + "attn_q_norm.weight", (s["head_dim"],), "F32"),
                    (b + "attn_k_norm.weight", (s["head_dim"],), "F32")]
    return out + [("output_norm.weight", (e,), "F32"), ("output.weight", (e, v), t["output"])]


def _metadata(w, s: dict) -> None:
    a = s["arch"]
    w.add_name(f"autotune tiny MoE ({a})")
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(s["n_layers"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_dimension_count(s["head_dim"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(s["n_expert"])
    w.add_expert_used_count(s["n_used"])
    if a == "qwen3moe":
        w.add_expert_feed_forward_length(s["n_ff"])
    w.add_file_type(1)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"<extra_{i}>" for i in range(s["n_vocab"] - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([2, 3, 3] + [6] * 256 + [4] * (len(tokens) - 259))
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def write_moe_gguf(path: str | Path, shape: str = "tiny", weights: bool = True,
                   seed: int = 0) -> Path:
    """Write the model of ``SHAPES[shape]`` to ``path`` (atomically); random weights when
    ``weights``, else the header and tensor table alone."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType
    from gguf import GGUFWriter

    s = SHAPES[shape]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    os.close(fd)
    rng = np.random.default_rng(seed)
    try:
        w = GGUFWriter(tmp, s["arch"])
        _metadata(w, s)
        for name, dims, tname in tensor_shapes(s):
            qtype = GGMLQuantizationType[tname]
            if weights:
                dtype = np.float16 if tname == "F16" else np.float32
                data = (rng.standard_normal(dims[::-1]) * 0.02).astype(dtype)
                if name.endswith("norm.weight"):
                    data[...] = 1.0
                w.add_tensor(name, data, raw_dtype=qtype)
            else:
                block, size = GGML_QUANT_SIZES[qtype]
                n = int(np.prod(dims))
                # an element shape (not uint8 bytes) and the quantized byte count
                w.add_tensor_info(name, dims[::-1], np.dtype(np.float32), n // block * size,
                                  raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        if weights:
            w.write_tensors_to_file()
        else:
            w.write_ti_data_to_file()
        w.close()
        Path(tmp).chmod(0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(write_moe_gguf(args.out, args.shape, weights=args.shape == "tiny", seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
