"""A deterministic tiny random-weight MLA model (DeepseekV2 layout) with the zoo's tokenizer.

It scores 0 on any eval, so, like `tiny-llama-random`, it proves plumbing only: the servers start
with a latent (MLA) KV cache, the KV crosses the connector, the KV digest compares it. That covers the MLA
block-geometry bug class (vLLM #50717: DeepSeek engines fail to start in P/D). Accuracy needs a
trained MLA model, which needs the GPU (the zoo's CPU training is too slow for it).

vLLM 0.32 CPU accepts MLA head sizes 320, 512 and 576, but its decode kernel
(`mla_decode_kvcache`) only runs 576: head 96 raised "Head dimension 96 is not supported by MLA",
head 320 "Unsupported block size: 16". The backend also forces block size 16 on every MLA
server. Hence kv_lora_rank 512 + qk_rope_head_dim 64, DeepSeek's own latent size
(docs/zoo.md).
"""
from __future__ import annotations

import shutil
from pathlib import Path

from harness.zoo.random_llama import build_once

NAME = "tiny-mla-random"
KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
# the zoo's tokenizer, so the gsm_synth task runs (harness.zoo.registry.CHECKPOINTS_DIR)
TOKENIZER_SOURCE = Path(__file__).parent / "checkpoints" / "tiny-llama-gsm"


def config_kwargs() -> dict:
    """DeepseekV2Config arguments: 2 dense layers (no routed-expert layer), 4 heads, no q LoRA."""
    from harness.zoo.tokenizer import BOS_ID, EOS_ID, PAD_ID

    return dict(
        vocab_size=1024, hidden_size=256, intermediate_size=768, moe_intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        n_shared_experts=1, n_routed_experts=2, num_experts_per_tok=2, first_k_dense_replace=2,
        kv_lora_rank=KV_LORA_RANK, q_lora_rank=None, qk_rope_head_dim=QK_ROPE_HEAD_DIM,
        qk_nope_head_dim=64, v_head_dim=64, max_position_embeddings=2048,
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
        tie_word_embeddings=False, rms_norm_eps=1e-6)


def build(out_dir: Path | None = None, seed: int = 0) -> Path:
    """Build (or reuse) the model directory and return its path."""
    return build_once(NAME, out_dir, seed, _write)


def _write(out: Path) -> None:
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    config = DeepseekV2Config(**config_kwargs())
    config.architectures = ["DeepseekV2ForCausalLM"]
    DeepseekV2ForCausalLM(config).to(torch.bfloat16).save_pretrained(
        str(out), safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(TOKENIZER_SOURCE / name, out / name)


__all__ = ["NAME", "build", "config_kwargs"]
