"""gsm_synth_boundary: the gsm_synth task with each prompt padded onto a KV block boundary, for
the `block-boundary` weather (harness.weathers; vLLM #50558: a prompt an exact multiple of
the block size made the decode allocate one block more than the prefill sent).

gsm_synth's prompts are 429-485 tokens in steps of 7, none at a boundary. Each doc here is a
gsm_synth doc whose context opens with a run of newlines (one token each in the zoo tokenizer,
BOS included in the count, as vLLM counts the prompt), so that its prompt is exactly
k*UNIT - 1, k*UNIT or k*UNIT + 1 tokens, the offset cycling -1, 0, +1 with the doc index. UNIT is
128: every block size that divides it (16, 32, 64, 128) sees the same three offsets. The
baseline is asked these same padded prompts, so the answers stay comparable. The harness's proxy
sends the decode the client's prompt unchanged (harness.serve.proxy.hops.build_decode_body): it
adds no token, so the prompt's count is the count on both hops.

Everything is a pure function of the seeds and the committed tokenizer, like harness.zoo.task.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from harness.weathers.block_boundary import BOUNDARY_UNIT
from harness.zoo import task

BOUNDARY_TASK_NAME = "gsm_synth_boundary"
UNIT = BOUNDARY_UNIT        # the boundary: a multiple of every block size the weather allows
OFFSETS = (-1, 0, 1)        # tokens from k*UNIT; doc i gets OFFSETS[i % 3]
PAD = "\n"                  # one token per repeat in the zoo tokenizer (tests check this)
TOKENIZER_MODEL = "tiny-llama-gsm"   # every zoo checkpoint ships the same tokenizer.json


@lru_cache(maxsize=1)
def _tokenizer():
    from tokenizers import Tokenizer

    from harness.zoo import registry

    return Tokenizer.from_file(str(registry.checkpoint_dir(TOKENIZER_MODEL) / "tokenizer.json"))


def prompt_tokens(text: str) -> int:
    """Tokens vLLM counts for `text` as a completion prompt (the BOS included)."""
    return len(_tokenizer().encode(text).ids)


def target_tokens(length: int, offset: int, unit: int = UNIT) -> int:
    """The smallest k*unit + offset (k >= 1) that is at least `length`."""
    k = max(1, -(-(length - offset) // unit))
    return k * unit + offset


def boundary_of(tokens: int, block: int) -> int | None:
    """`tokens`' offset from the nearest multiple of `block` when it is -1, 0 or +1, else None."""
    rest = tokens % block
    return {0: 0, 1: 1, block - 1: -1}.get(rest) if block > 2 else None


def pad_doc(doc: dict, index: int) -> dict:
    """`doc` with its context padded so its prompt lands on k*UNIT + OFFSETS[index % 3]."""
    offset = OFFSETS[index % len(OFFSETS)]
    base = prompt_tokens(task.prompt_text(doc))
    target = target_tokens(base, offset)
    padded = {**doc, "context": PAD * (target - base) + doc["context"]}
    got = prompt_tokens(task.prompt_text(padded))
    if got != target:   # the pad must add exactly one token per repeat
        raise ValueError(f"doc {index}: padded to {got} tokens, wanted {target}")
    return {**padded, "prompt_tokens": target, "boundary_offset": offset}


def default_data_dir() -> Path:
    root = Path(os.environ.get("PD_ACCURACY_CACHE", Path.home() / ".cache" / "pd-accuracy"))
    return root / "data" / BOUNDARY_TASK_NAME


def write_boundary_splits(data_dir: str | os.PathLike[str] | None = None, *,
                          test_size: int = task.TEST_SIZE,
                          train_size: int = task.TRAIN_FILE_SIZE) -> Path:
    """Write train.jsonl/test.jsonl (deterministic) into `data_dir` and return it."""
    return task.write_splits(
        data_dir if data_dir is not None else default_data_dir(), test_size=test_size,
        train_size=train_size,
        docs=lambda seed, size: (pad_doc(d, i) for i, d in enumerate(task.iter_docs(seed, 0, size))))


if __name__ == "__main__":
    import sys

    print(write_boundary_splits(sys.argv[1] if len(sys.argv) > 1 else None))
