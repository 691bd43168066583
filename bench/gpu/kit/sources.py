"""What the GPU kit prepares here, before a lease: TabbyAPI's source, llama.cpp's, a tiny GGUF.

All of it goes into git-ignored folders under ``bench/gpu/`` and travels with a device call
(``carry``); none of it is committed. ``bench/gpu/prepare.sh`` runs these in order:

``tabby SRC``  TabbyAPI's main branch from a git directory (a clone, or the bare mirror the
               ``fetch`` tool makes) or a plain folder into ``bench/gpu/tabbyAPI``, with its
               commit in ``TABBY_COMMIT`` (:func:`tabby_source`); ``--ref exl2-checkpoint
               --dest bench/gpu/tabbyAPI-exl2``: the branch that drives exllamav2;
``llama``      llama.cpp as vendored in llama-cpp-python's sdist (the installed version, so
               the server and the binding agree), trimmed to what the ``llama-server`` CUDA
               build needs, into ``bench/gpu/llama.cpp`` (:func:`llama_source`);
``gguf``       a tiny Llama GGUF (4 layers, hidden 256, f16, its own BPE vocabulary and a chat
               template) written with the ``gguf`` package into ``bench/gpu/gguf/``
               (:func:`write_tiny_gguf`): llama.cpp's converter refuses the tiny tokenizer
               ("BPE pre-tokenizer was not recognized"), and no torch is needed this way;
               beside it ``tiny-moe.gguf``, the tests' tiny Mixture-of-Experts
               (:mod:`autotune.tools.make_tiny_moe`: 4 layers of 8 experts), for issue 44's
               ``--n-cpu-moe`` rows.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from autotune.tools import make_tiny_llama

ROOT = Path(__file__).resolve().parents[3]
KIT = ROOT / "bench" / "gpu"
# top-level folders of vendor/llama.cpp the build never reads (models/ holds 78 MB of vocab files)
LLAMA_DROP = {"models", "docs", "tests", "benches", "media", "examples", "gguf-py", "conversion",
              "scripts", "skills", ".github", ".devops", "ci", "prompts", "grammars", "pocs"}
# ggml backends other than the CPU's and CUDA's (each is added only when its GGML_* is on)
GGML_KEEP = {"ggml-cpu", "ggml-cuda", "ggml-blas", "ggml-rpc"}
SHAPE = {"layers": 4, "hidden": 256, "ffn": 768, "heads": 4, "ctx": 2048}


def tabby_source(src: Path, dest: Path, ref: str = "HEAD") -> str:
    """Export TabbyAPI's tree at ``src``'s ``ref`` (HEAD: main; ``exl2-checkpoint``) into
    ``dest``; returns the commit (or '' for a plain folder, copied as it is)."""
    src = Path(src)
    git = ["git", "--git-dir", str(src)] if (src / "HEAD").is_file() and (src / "objects").is_dir() \
        else ["git", "-C", str(src)]
    commit = subprocess.run([*git, "rev-parse", "--verify", f"{ref}^{{commit}}"], capture_output=True,
                            text=True, check=False)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if commit.returncode == 0:
        tar = subprocess.run([*git, "archive", "--format=tar", ref], capture_output=True, check=True)
        with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
            t.extractall(dest, filter="data")
        sha = commit.stdout.strip()
    else:  # a plain folder (no git): copied as it is
        shutil.copytree(src, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git", "venv"))
        sha = ""
    if not (dest / "main.py").is_file() or not (dest / "pyproject.toml").is_file():
        raise SystemExit(f"error: {src} is not a TabbyAPI checkout (no main.py / pyproject.toml)")
    (dest / "TABBY_COMMIT").write_text(sha + "\n")
    return sha


def keep_llama(path: str) -> bool:
    """Whether a path inside vendor/llama.cpp is needed by the llama-server CUDA build."""
    parts = path.split("/")
    if parts[0] in LLAMA_DROP:
        return False
    return not (parts[:2] == ["ggml", "src"] and len(parts) > 3 and parts[2].startswith("ggml-")
                and parts[2] not in GGML_KEEP)


def llama_source(version: str, dest: Path, sdist: Path | None = None) -> int:
    """llama-cpp-python ``version``'s vendored llama.cpp, trimmed, into ``dest``; its bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        if sdist is None:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                   f"llama-cpp-python=={version}", "-d", tmp]
            subprocess.run(cmd, check=True, capture_output=True)
            sdist = next(Path(tmp).glob("*.tar.gz"))
        if dest.exists():
            shutil.rmtree(dest)
        total = 0
        with tarfile.open(sdist) as tar:
            prefix = tar.getnames()[0].split("/")[0] + "/vendor/llama.cpp/"
            members = []
            for m in tar.getmembers():
                rel = m.name[len(prefix):] if m.name.startswith(prefix) else ""
                if rel and keep_llama(rel):
                    m.name = rel
                    members.append(m)
                    total += m.size
            tar.extractall(dest, members=members, filter="data")
    (dest / "LLAMA_CPP_PYTHON_VERSION").write_text(version + "\n")
    return total


def _vocab(vocab_size: int) -> tuple[list[str], list[int], list[str], dict[str, int]]:
    """tokens, token types, merges and special ids of the tiny BPE (make_tiny_llama's)."""
    from autotune.tools.make_tiny_llama import DEFAULT_TEXT
    from autotune.tools.make_tiny_llama import SPECIAL
    from autotune.tools.make_tiny_llama import train_tokenizer

    model = json.loads(train_tokenizer(DEFAULT_TEXT, vocab_size).to_str())["model"]
    ids = model["vocab"]
    tokens = [t for t, _ in sorted(ids.items(), key=lambda kv: kv[1])]
    types = [3 if t in SPECIAL else 1 for t in tokens]  # 3: control, 1: normal
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, types, merges, {s: ids[s] for s in SPECIAL}


def write_tiny_gguf(path: Path, seed: int = 1, vocab_size: int = 512) -> Path:
    """A random tiny Llama (:data:`SHAPE`, f16 weights) as GGUF, with its tokenizer."""
    import gguf
    import numpy as np

    tokens, types, merges, special = _vocab(vocab_size)
    n, d, f, h = len(tokens), SHAPE["hidden"], SHAPE["ffn"], SHAPE["heads"]
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("autotune tiny llama")
    w.add_context_length(SHAPE["ctx"])
    w.add_embedding_length(d)
    w.add_block_count(SHAPE["layers"])
    w.add_feed_forward_length(f)
    w.add_head_count(h)
    w.add_head_count_kv(h)
    w.add_rope_dimension_count(d // h)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(special["<s>"])
    w.add_eos_token_id(special["</s>"])
    w.add_unk_token_id(special["<unk>"])
    w.add_add_bos_token(True)
    w.add_chat_template(make_tiny_llama.CHAT_TEMPLATE)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float16)

    w.add_tensor("token_embd.weight", mat(n, d))
    for i in range(SHAPE["layers"]):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(d, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(b + name + ".weight", mat(d, d))
        w.add_tensor(b + "ffn_norm.weight", np.ones(d, dtype=np.float32))
        w.add_tensor(b + "ffn_gate.weight", mat(f, d))
        w.add_tensor(b + "ffn_up.weight", mat(f, d))
        w.add_tensor(b + "ffn_down.weight", mat(d, f))
    w.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    w.add_tensor("output.weight", mat(n, d))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu.kit.sources", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    tb = sub.add_parser("tabby", help="TabbyAPI's source into bench/gpu/tabbyAPI")
    tb.add_argument("src", help="a TabbyAPI git directory (clone or bare mirror) or folder")
    tb.add_argument("--ref", default="HEAD", help="the branch or commit (default HEAD: main)")
    tb.add_argument("--dest", default=str(KIT / "tabbyAPI"))
    ll = sub.add_parser("llama", help="trimmed llama.cpp source into bench/gpu/llama.cpp")
    ll.add_argument("--version", help="llama-cpp-python version (default: the installed one)")
    ll.add_argument("--sdist", help="a downloaded llama-cpp-python sdist (default: pip download)")
    ll.add_argument("--dest", default=str(KIT / "llama.cpp"))
    gg = sub.add_parser("gguf", help="the tiny GGUFs into bench/gpu/gguf/ (tiny-f16.gguf, tiny-moe.gguf)")
    gg.add_argument("--out", default=str(KIT / "gguf" / "tiny-f16.gguf"))
    gg.add_argument("--moe-out", default=str(KIT / "gguf" / "tiny-moe.gguf"))
    a = ap.parse_args(argv)
    if a.cmd == "tabby":
        if not Path(a.src).exists():
            print(f"error: TabbyAPI source {a.src!r} does not exist (fetch github:theroyallab/tabbyAPI)",
                  file=sys.stderr)
            return 2
        sha = tabby_source(Path(a.src), Path(a.dest), a.ref)
        print(f"TabbyAPI {sha or '(no git commit)'} -> {a.dest}")
    elif a.cmd == "llama":
        from importlib.metadata import version

        ver = a.version or version("llama_cpp_python")
        size = llama_source(ver, Path(a.dest), Path(a.sdist) if a.sdist else None)
        print(f"llama.cpp of llama-cpp-python {ver}: {size / 2**20:.1f} MiB -> {a.dest}")
    else:
        from autotune.tools.make_tiny_moe import write_moe_gguf

        for out in (write_tiny_gguf(Path(a.out)), write_moe_gguf(Path(a.moe_out))):
            print(f"{out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
