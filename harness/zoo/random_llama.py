"""A deterministic tiny random-weight Llama with an offline byte-level BPE tokenizer.

It scores ~0 on any eval, so it only proves plumbing (servers start, KV crosses, generations
agree); accuracy comparisons use the trained zoo models. Built into a cache directory on first
use; the same seed gives byte-identical weights.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from harness.core.atomic import atomic_write_text

NAME = "tiny-llama-random"
_CORPUS_SEED_TEXT = (
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many "
    "clips in May. How many clips did Natalia sell altogether in April and May?\n"
    "Answer: Natalia sold 48/2 = 24 clips in May. Natalia sold 48+24 = 72 clips altogether. #### 72\n"
)


def cache_root() -> Path:
    return Path(os.environ.get("PD_ACCURACY_CACHE", Path.home() / ".cache" / "pd-accuracy"))


def build_tokenizer(out_dir: Path, vocab_size: int = 512) -> None:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    corpus = [_CORPUS_SEED_TEXT * 4] + [f"{i} + {j} = {i + j}. " for i in range(60) for j in range(0, 60, 7)]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=vocab_size, min_frequency=1,
                            special_tokens=["<s>", "</s>", "<unk>", "<pad>"], show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>", pad_token="<pad>")
    tok.save_pretrained(str(out_dir))


def build_once(name: str, out_dir: Path | None, seed: int, write: Callable[[Path], None]) -> Path:
    """A random model's directory (`out_dir`, default the cache's models/`name`), written by
    `write(dir)` under torch seed `seed` unless an earlier build completed it."""
    import torch

    out = Path(out_dir) if out_dir else cache_root() / "models" / name
    marker = out / ".complete"
    if marker.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    write(out)
    atomic_write_text(marker, json.dumps({"seed": seed}))
    return out


def build(out_dir: Path | None = None, seed: int = 0) -> Path:
    """Build (or reuse) the model directory and return its path."""
    return build_once(NAME, out_dir, seed, _write)


def _write(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    build_tokenizer(out)
    config = LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=64,
        max_position_embeddings=4096, bos_token_id=0, eos_token_id=1, pad_token_id=3,
        tie_word_embeddings=False, torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)


if __name__ == "__main__":
    print(build())
