"""Make a tiny random Llama model with its own BPE tokenizer, offline and deterministic.

Usage (with an interpreter that has torch, transformers and tokenizers, e.g. the vLLM venv)::

    .venv-vllm/bin/python -m autotune.tools.make_tiny_llama OUT_DIR [--text FILE] [--vocab N]

The model is a 2-layer LlamaConfig with hidden_size 64 and one attention head, so head_dim is
64, the minimum of vLLM's CPU attention backend (shared/STACK.md). Its weights are random
(seeded); it exists to exercise engines end to end, not to produce sensible text. The
tokenizer is a byte-level BPE trained on a local text (by default the GPL-3 text shipped for
the quality metrics), with a minimal chat template. Files are written to a temporary folder and
moved into place.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

DEFAULT_TEXT = Path(__file__).resolve().parent.parent / "data" / "quality" / "gpl3.txt"
SPECIAL = ["<unk>", "<s>", "</s>"]
# a minimal chat template, so servers that answer chat completions (TabbyAPI, llama-server) can
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant:{% endif %}")


def train_tokenizer(text_path: Path, vocab_size: int):
    """A byte-level BPE tokenizer trained on ``text_path`` (deterministic)."""
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from tokenizers import processors
    from tokenizers import trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train([str(text_path)], trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok


def make_tiny_llama(
    out_dir: str | Path,
    text_path: str | Path = DEFAULT_TEXT,
    vocab_size: int = 512,
    num_layers: int = 2,
    seed: int = 0,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_heads: int = 1,
    dtype: str = "float32",
) -> Path:
    """Write a tiny random Llama (config, safetensors, tokenizer) to ``out_dir``.

    The tokenizer depends only on ``text_path`` and ``vocab_size``, so models made with the
    same two share their vocabulary (a draft model for speculative decoding). ``num_heads``
    divides ``hidden_size``; head_dim = hidden_size / num_heads.
    """
    import torch
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    torch.manual_seed(seed)
    raw = train_tokenizer(Path(text_path), vocab_size)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="</s>", model_max_length=2048,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=raw.get_vocab_size(), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        head_dim=hidden_size // num_heads, max_position_embeddings=2048, bos_token_id=raw.token_to_id("<s>"),
        eos_token_id=raw.token_to_id("</s>"), pad_token_id=raw.token_to_id("</s>"),
        tie_word_embeddings=False, torch_dtype=dtype,
    )
    model = LlamaForCausalLM(config).to(getattr(torch, dtype)).eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--text", default=str(DEFAULT_TEXT), help="training text for the tokenizer")
    ap.add_argument("--vocab", type=int, default=512, help="tokenizer vocabulary size")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = make_tiny_llama(args.out_dir, args.text, args.vocab, args.layers, args.seed)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
