"""Real-shape random-weight models: the published shapes of the models vLLM's P/D CI runs, with no
weights at all (a config.json and the zoo's tokenizer), served with vLLM's `--load-format dummy`.

No checkpoint of those models can be carried to the offline GPU machine, but the KV a P/D pair
moves, its block geometry, the transfer's byte count and the digest's cost depend only on the
shape: layers, attention/KV heads, head size, MLA ranks, sliding window, SSM state. Those are
copied from each model's published config.json. What is changed, and why:
- the vocabulary is the zoo tokenizer's (802 tokens): every id the random weights sample decodes,
  and the zoo task's prompts (429-485 tokens) fit the matrix's max_model_len;
- MoE models keep 8 routed experts (published: 64) with their published top-k: the experts hold
  no KV and would only take GPU memory; the attention and SSM layers are the published ones;
- the special token ids are the zoo tokenizer's.
Random weights answer nothing: a cell on one of these is judged on its transfer proof, the exact
byte count and the KV digest alone (harness.judge.verdict, `random_weights`).
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.zoo.tokenizer import BOS_ID, EOS_ID, PAD_ID

SHAPES_PREFIX = "shape-"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
TOKENIZER_VOCAB = 802          # the zoo tokenizer's vocabulary, special tokens included
MOE_EXPERTS = 8
# the KV budgets below hold 16 concurrent requests (lm-eval's concurrency) of 768 tokens (the zoo
# task's longest prompt, 485, plus 192 generated) at each shape's KV bytes per token
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_IDS = dict(vocab_size=TOKENIZER_VOCAB, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
            pad_token_id=PAD_ID)


@dataclass(frozen=True)
class Shape:
    name: str                      # the matrix's model name: shape-<published name>
    published: str                 # the hub id whose config.json the shape copies
    architecture: str
    config_class: str              # transformers config class that completes the defaults
    config_kwargs: dict[str, Any] = field(hash=False)
    # KV cache per server: the tiny models' 512 MiB default holds ~7 of 16 concurrent requests
    # at 112 KiB a token (Qwen3), and a decode that preempts recomputes its prompt itself
    kv_cache_gib: float = 0.5
    changed: tuple[str, ...] = ()  # what differs from the published config, besides vocab/ids

    def config(self) -> dict[str, Any]:
        import transformers

        config = getattr(transformers, self.config_class)(**self.config_kwargs, **_IDS)
        config.architectures = [self.architecture]
        out = config.to_dict()
        out["dtype"] = "bfloat16"
        return out


_GRANITE_LAYERS = (["mamba"] * 5 + ["attention"] + ["mamba"] * 9 + ["attention"] + ["mamba"] * 9
                   + ["attention"] + ["mamba"] * 9 + ["attention"] + ["mamba"] * 4)

SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("shape-qwen3-0.6b", "Qwen/Qwen3-0.6B", "Qwen3ForCausalLM", "Qwen3Config", dict(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True, use_sliding_window=False, sliding_window=None),
          kv_cache_gib=1.5),       # 16 x 768 x 112 KiB = 1.31 GiB
    Shape("shape-granite-4.0-h-tiny", "ibm-granite/granite-4.0-h-tiny",
          "GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", dict(
              hidden_size=1536, intermediate_size=512, num_hidden_layers=40,
              layer_types=_GRANITE_LAYERS, num_attention_heads=12, num_key_value_heads=4,
              max_position_embeddings=131072, position_embedding_type="nope",
              attention_multiplier=0.0078125, embedding_multiplier=12, logits_scaling=6,
              mamba_chunk_size=256, mamba_conv_bias=True, mamba_d_conv=4, mamba_d_head=64,
              mamba_d_state=128, mamba_expand=2, mamba_n_groups=1, mamba_n_heads=48,
              mamba_proj_bias=False, num_local_experts=MOE_EXPERTS, num_experts_per_tok=6,
              shared_intermediate_size=1024, tie_word_embeddings=True),
          # 36 Mamba2 states of 806,400 B per request (~29 MB) in 400-token pages
          kv_cache_gib=1.5, changed=(f"num_local_experts {MOE_EXPERTS} (published 64)",)),
    Shape("shape-deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite-Chat", "DeepseekV2ForCausalLM",
          "DeepseekV2Config", dict(
              hidden_size=2048, intermediate_size=10944, num_hidden_layers=27,
              num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None,
              qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
              first_k_dense_replace=1, moe_intermediate_size=1408, n_routed_experts=MOE_EXPERTS,
              n_shared_experts=2, num_experts_per_tok=6, n_group=1, topk_group=1,
              topk_method="greedy", norm_topk_prob=False, routed_scaling_factor=1.0,
              max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False,
              rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                               "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707,
                               "mscale_all_dim": 0.707,
                               "original_max_position_embeddings": 4096}),
          kv_cache_gib=0.75,       # 16 x 768 x 30.4 KiB = 0.36 GiB
          changed=(f"n_routed_experts {MOE_EXPERTS} (published 64)",)),
    # google/gemma-3-4b-it's decoder (its text_config, completed by Gemma3TextConfig's defaults:
    # 8 heads, 4 KV heads, head size 256, a 1024-token window on 5 of every 6 layers), served as
    # the text-only Gemma3ForCausalLM
    Shape("shape-gemma-3-4b", "google/gemma-3-4b-it", "Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, sliding_window=1024, max_position_embeddings=131072,
        query_pre_attn_scalar=256,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1000000.0}}),
          kv_cache_gib=2.0,        # 16 x 768 x 136 KiB = 1.59 GiB (768 tokens < the window)
          changed=("text decoder only (Gemma3ForCausalLM; published: "
                   "Gemma3ForConditionalGeneration with a vision tower)",)),
)}


def shape_names() -> list[str]:
    return list(SHAPES)


def kv_cache_bytes(name: str) -> int | None:
    """The KV budget a server of shape `name` needs; None for any other model."""
    shape = SHAPES.get(name)
    return None if shape is None else int(shape.kv_cache_gib * (1 << 30))


def has_weights(model_dir: str | Path) -> bool:
    """Whether a local model directory holds any weight file (else vLLM needs --load-format dummy)."""
    p = Path(model_dir)
    return p.is_dir() and any(f.name.endswith(WEIGHT_SUFFIXES) for f in p.iterdir())


def build(name: str, out_dir: Path, tokenizer_dir: Path) -> Path:
    """Write `name`'s config.json, the shape card and the zoo tokenizer into `out_dir`."""
    shape = SHAPES[name]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(shape.config(), indent=2, sort_keys=True) + "\n")
    (out_dir / "shape.json").write_text(json.dumps({
        "published": shape.published, "weights": "none: vLLM --load-format dummy",
        "changed": [f"vocab_size {TOKENIZER_VOCAB} (the zoo tokenizer's)",
                    "bos/eos/pad ids the zoo tokenizer's", *shape.changed]}, indent=2) + "\n")
    for f in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / f, out_dir / f)
    return out_dir
