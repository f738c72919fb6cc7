"""Pure PyTorch accuracy probe, with an optional zeroed 128-token block of the prompt's KV.

This checks the task design without vLLM: a forward hook zeroes the outputs of every attention
layer's k_proj and v_proj at the prompt positions of one block during prefill, which is what a
zeroed KV-cache block looks like to the decode steps (RoPE and QK-norm map zero to zero). SSM/GDN
layers are left alone: in P/D their state travels separately from the attention blocks.

MLA (DeepseekV2) has no k_proj/v_proj: its cache holds one latent per token, the
kv_a_layernorm'd compressed kv (kv_lora_rank) and the roped shared key k_pe (qk_rope_head_dim),
what vLLM's MLA cache holds too. The hook zeroes the output of kv_a_proj_with_mqa, which is
[compressed kv | k_pe] before the norm and RoPE; RMSNorm and RoPE map zero to zero, so the cached
latent and k_pe of the block are zero, and so are the keys and values kv_b_proj (no bias) expands
from them: a zeroed latent block.
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from contextlib import contextmanager

from harness.zoo import task
from harness.zoo.data import LineTokenCache
from harness.zoo.tokenizer import EOS_ID, PAD_ID

BLOCK_SIZE = 128
# the projections whose outputs are a token's cached KV: K and V, or MLA's latent
ZEROED_PROJECTIONS = ("self_attn.k_proj", "self_attn.v_proj", "self_attn.kv_a_proj_with_mqa")
STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")


def block_span(prompt_len: int, which: str, block_size: int = BLOCK_SIZE) -> tuple[int, int]:
    """[start, end) of the first, middle or last block of a prompt of `prompt_len` tokens."""
    n_blocks = math.ceil(prompt_len / block_size)
    index = {"first": 0, "middle": n_blocks // 2, "last": n_blocks - 1}[which]
    return index * block_size, min((index + 1) * block_size, prompt_len)


@contextmanager
def zeroed_kv(model, prompt_len: int, spans: list[tuple[int, int] | None]):
    """During prefill of a batch of `prompt_len`-token prompts, zero K and V of positions
    spans[row][0]:spans[row][1] of each row in every attention layer (None: row untouched);
    for MLA the latent (compressed kv and k_pe, see the module docstring)."""
    import torch

    mask = torch.zeros(len(spans), prompt_len, dtype=torch.bool)
    for row, span in enumerate(spans):
        if span is not None:
            mask[row, span[0]:span[1]] = True
    keep_cache: dict = {}

    def hook(_module, _inputs, output):
        if output.shape[1] != prompt_len:       # decode steps see 1 token
            return None
        keep = keep_cache.get(output.device)
        if keep is None:
            keep = keep_cache[output.device] = (~mask).to(output.device)[..., None]
        return output * keep.to(output.dtype)

    handles = []
    if mask.any():
        for name, module in model.named_modules():
            if name.endswith(ZEROED_PROJECTIONS):
                handles.append(module.register_forward_hook(hook))
        if not handles:
            raise RuntimeError("no attention k_proj/v_proj (or MLA kv_a_proj_with_mqa) found to zero")
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def strict_answer(text: str) -> str | None:
    match = STRICT_RE.search(text)
    return match.group(1).replace(",", "").rstrip(".") if match else None


CONDITIONS = ("clean", "zero_first", "zero_middle", "zero_last")


def probe(model, cache: LineTokenCache, *, device: str, n: int,
          conditions: tuple[str, ...] = CONDITIONS, max_new_tokens: int = 150,
          max_rows: int = 256) -> dict:
    """Greedy strict-match accuracy on the first `n` test docs, clean and with one block of the
    prompt's attention KV zeroed ("zero_first" | "zero_middle" | "zero_last"). All conditions of
    a doc run in the same batch; prompts are batched by equal length (no padding)."""
    import torch

    docs = list(task.iter_docs(task.TEST_SEED, 0, n))
    by_len: dict[int, list[tuple[dict, list[int]]]] = defaultdict(list)
    for doc in docs:
        ids = cache.encode(task.prompt_text(doc), bos=True)
        by_len[len(ids)].append((doc, ids))
    correct = {c: 0 for c in conditions}
    total = {c: 0 for c in conditions}
    model.eval()
    per_chunk = max(1, max_rows // len(conditions))
    for length, group in sorted(by_len.items()):
        for i in range(0, len(group), per_chunk):
            chunk = group[i: i + per_chunk]
            rows = [(cond, doc, ids) for cond in conditions for doc, ids in chunk]
            spans = [None if cond == "clean" else block_span(length, cond.split("_", 1)[1])
                     for cond, _, _ in rows]
            input_ids = torch.tensor([ids for _, _, ids in rows], device=device)
            with torch.no_grad(), zeroed_kv(model, length, spans):
                out = model.generate(
                    input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=EOS_ID,
                    pad_token_id=PAD_ID)
            for (cond, doc, _), row in zip(rows, out[:, length:].tolist()):
                if EOS_ID in row:
                    row = row[: row.index(EOS_ID)]
                total[cond] += 1
                correct[cond] += strict_answer(cache.decode(row)) == str(doc["result"])
    return {c: {"n": total[c], "correct": correct[c],
                "accuracy": correct[c] / total[c] if total[c] else 0.0} for c in conditions}
