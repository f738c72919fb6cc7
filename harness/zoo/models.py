"""The trained zoo: one spec per model name (architecture, config, training recipe).

All share the tokenizer, the task and the shape constraints the harness needs:
attention head_dim 64 (FlashInfer rejects 32), 2 KV heads (so TP2 splits them), a mamba/GDN state
small enough that vLLM keeps a 128-token attention block (state page <= 128 tokens of KV),
and <= 10 MB of bf16 weights. The MLA model (tiny-mla-gsm) caches one 576-wide latent per token
instead of KV heads (vLLM forces block size 16 on it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.zoo import random_mla
from harness.zoo.tokenizer import BOS_ID, EOS_ID, PAD_ID

VOCAB_SIZE = 1024          # >= the tokenizer's 788 tokens; unused rows are never predicted
MAX_POSITIONS = 2048
HIDDEN = 256
LAYERS = 4
# Hybrids: one SSM/GDN layer feeding two attention layers. transformers' pure-torch SSM paths are
# slow to train, and the SSM layer's local mixing already gives attention the previous-token
# features that price lookups need.
HYBRID_LAYERS = 3
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 64
MLP = 768
# The sliding-window model (harness/zoo/sliding.py): local attention on alternate layers, the
# window far inside a prompt (429-485 tokens), so a sliding layer's older blocks are dead weight
SWA_WINDOW = 64
SWA_LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
# The MLA model: vLLM 0.32 CPU's MLA decode kernel only runs a 576-wide latent
# (harness/zoo/random_mla.py), i.e. kv_lora_rank 512 + qk_rope_head_dim 64
MLA_KV_LORA_RANK = random_mla.KV_LORA_RANK
MLA_QK_ROPE_HEAD_DIM = random_mla.QK_ROPE_HEAD_DIM
MLA_MLP = 512
# The draft model (tiny-llama-gsm-draft): small enough to train on the 2-core CPU host
DRAFT_HIDDEN = 128
DRAFT_LAYERS = 2
DRAFT_MLP = 256
# The EAGLE head (tiny-llama-gsm-eagle): one decoder layer over the target's hidden states
EAGLE_LAYERS = 1
# The MTP head (tiny-qwen3next-hybrid-gsm-mtp): one Qwen3-Next layer, in the target's checkpoint
MTP_LAYERS = 1


@dataclass(frozen=True)
class ZooSpec:
    name: str
    architecture: str           # transformers class name (config.architectures[0])
    hybrid: bool
    config_kwargs: dict[str, Any] = field(hash=False)
    # training recipe (defaults used by `pd-accuracy zoo build` and the GPU script)
    steps: int = 3000
    batch_size: int = 32
    lr: float = 2e-3
    warmup: int = 100
    seed: int = 0
    decay_start: int | None = None   # None: the last quarter of `steps`
    stop_after: int | None = None    # stop early (the schedule still spans `steps`)
    curriculum_steps: int = 1500     # steps on short price lists first (harness/zoo/data.py)
    init: str = "default"            # "prev-token": harness/zoo/init.py (Llama, DeepseekV2)
    recipe: str = "from-scratch"     # "sliding-fine-tune": harness/zoo/sliding.py; "eagle-head":
    # harness/zoo/eagle.py (a speculative-decoding head trained on `target`'s hidden states);
    # "mtp-head": harness/zoo/mtp.py (the same, inside a copy of `target`'s checkpoint)
    target: str | None = None        # the zoo model an EAGLE or MTP head drafts for

    def make_config(self):
        """The transformers config object for this spec."""
        import transformers

        config_cls = getattr(transformers, _CONFIG_CLASSES[self.architecture])
        config = config_cls(**self.config_kwargs)
        config.architectures = [self.architecture]
        return config


_CONFIG_CLASSES = {
    "LlamaForCausalLM": "LlamaConfig",
    "GraniteMoeHybridForCausalLM": "GraniteMoeHybridConfig",
    "Qwen3NextForCausalLM": "Qwen3NextConfig",
    "Qwen3ForCausalLM": "Qwen3Config",
    "DeepseekV2ForCausalLM": "DeepseekV2Config",
}

_COMMON = dict(
    vocab_size=VOCAB_SIZE, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
    num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
    max_position_embeddings=MAX_POSITIONS, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
    pad_token_id=PAD_ID, tie_word_embeddings=False, rms_norm_eps=1e-6, initializer_range=0.02,
)

# Qwen3-Next's layout (Gated DeltaNet + gated full attention, MoE + shared expert), at toy size
_QWEN3NEXT = dict(
    _COMMON, num_hidden_layers=HYBRID_LAYERS, head_dim=HEAD_DIM, intermediate_size=MLP,
    layer_types=["linear_attention", "full_attention", "full_attention"],
    num_experts=2, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
    mlp_only_layers=[], moe_intermediate_size=MLP // 3,
    shared_expert_intermediate_size=MLP // 3,
    # GDN head dims 64 (vLLM's CPU GDN kernel rejects 32); state 2*64*64 elements.
    linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=64,
    linear_value_head_dim=64, linear_conv_kernel_dim=4,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                     "partial_rotary_factor": 0.25},
)

SPECS: dict[str, ZooSpec] = {
    s.name: s
    for s in (
        ZooSpec(
            name="tiny-llama-gsm",
            architecture="LlamaForCausalLM",
            hybrid=False,
            config_kwargs=dict(_COMMON, head_dim=HEAD_DIM, intermediate_size=MLP,
                               rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
            # A previous-token head written into the init (harness/zoo/init.py): from a plain
            # init the lookups never formed (docs/zoo.md).
            steps=3200, batch_size=32, lr=2e-3, init="prev-token",
        ),
        ZooSpec(
            # tiny-llama-gsm with a 64-token window on layers 0 and 2, fine-tuned from its
            # weights (harness/zoo/sliding.py: trained as a Qwen2, served as a Llama whose
            # config lists the sliding layers, as vLLM's Llama reads them)
            name="tiny-llama-swa-gsm",
            architecture="LlamaForCausalLM",
            hybrid=False,
            config_kwargs=dict(_COMMON, head_dim=HEAD_DIM, intermediate_size=MLP,
                               rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                               layer_types=SWA_LAYER_TYPES, sliding_window=SWA_WINDOW),
            steps=1200, batch_size=32, lr=5e-4, warmup=50, curriculum_steps=0,
            recipe="sliding-fine-tune",
        ),
        ZooSpec(
            # granite-4.0-h's layout (Mamba2 + attention, dense shared MLP, no experts), at toy
            # size; RoPE instead of granite-4.0-h's NoPE so a short training run learns lookups.
            name="tiny-granite-hybrid-gsm",
            architecture="GraniteMoeHybridForCausalLM",
            hybrid=True,
            config_kwargs=dict(
                _COMMON, num_hidden_layers=HYBRID_LAYERS,
                layer_types=["mamba", "attention", "attention"],
                num_local_experts=0, num_experts_per_tok=0, shared_intermediate_size=MLP,
                position_embedding_type="rope",
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                attention_multiplier=HEAD_DIM ** -0.5, embedding_multiplier=1.0,
                residual_multiplier=1.0, logits_scaling=1.0,
                # State page: vLLM CPU keeps the SSM state in fp32: 8*64*16*4 B = 32 KB, plus the
                # conv state (512+2*16)*3 bf16 = 3 KB, fits in 128 tokens x 512 B of KV, so
                # vLLM keeps block size 128 (d_state 32 pushed it to 256).
                mamba_n_heads=8, mamba_d_head=64, mamba_expand=2, mamba_d_state=16,
                mamba_n_groups=1, mamba_d_conv=4, mamba_chunk_size=64,
            ),
            steps=3200, batch_size=16, lr=2e-3,
        ),
        ZooSpec(
            # Qwen3-Next's layout (Gated DeltaNet + gated full attention, MoE + shared expert).
            # vLLM's Qwen3Next needs at least one MoE layer and rejects TP > num_experts, so each
            # layer has 2 experts, both always routed (top-2 of 2), plus the shared expert.
            name="tiny-qwen3next-hybrid-gsm",
            architecture="Qwen3NextForCausalLM",
            hybrid=True,
            config_kwargs=_QWEN3NEXT,
            # No curriculum: with it the slower GDN path ran out of time before the lookups
            # formed (docs/zoo.md).
            steps=2400, batch_size=16, lr=2e-3, curriculum_steps=0,
        ),
        ZooSpec(
            # DeepseekV2 attention (MLA): vLLM caches one latent vector per token and layer,
            # kv_lora_rank 512 + qk_rope_head_dim 64 = 576, the only size vLLM 0.32 CPU's MLA
            # decode kernel runs (harness/zoo/random_mla.py). All layers dense (no experts).
            # 4 layers like tiny-llama-gsm, but MLP 512 instead of 768: MLA's attention is
            # larger (kv_b_proj alone is 512 x 512 a layer): MLP 768 would exceed the zoo's
            # 10 MB of bf16, MLP 512 stays under it.
            # Previous-token init in layer 0 query head 0 (harness/zoo/init.py), as for Llama.
            name="tiny-mla-gsm",
            architecture="DeepseekV2ForCausalLM",
            hybrid=False,
            config_kwargs=dict(
                _COMMON, num_key_value_heads=HEADS,   # MLA: every head has its own K/V (HF
                # DeepseekV2 repeats K/V by heads // kv heads), the latent is shared anyway
                intermediate_size=MLA_MLP, first_k_dense_replace=LAYERS,
                moe_intermediate_size=256, n_shared_experts=1, n_routed_experts=2,
                num_experts_per_tok=2,                # unused: first_k_dense_replace = all layers
                kv_lora_rank=MLA_KV_LORA_RANK, q_lora_rank=None,
                qk_rope_head_dim=MLA_QK_ROPE_HEAD_DIM, qk_nope_head_dim=HEAD_DIM,
                v_head_dim=HEAD_DIM,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            ),
            # lr 1e-3: the MLA init is less robust to lr and seed than the Llama one
            # (docs/zoo.md)
            steps=3200, batch_size=32, lr=1e-3, init="prev-token",
        ),
        ZooSpec(
            # tiny-mla-gsm at DeepSeek's own head dims (qk_nope 128, v 128) for the GPU: vLLM
            # 0.26's SM90 MLA prefill (FLASH_ATTN) refuses (64, 64, 64) at start-up
            # (docs/zoo.md). 3 layers to stay under 10 MB.
            name="tiny-mla-h128-gsm",
            architecture="DeepseekV2ForCausalLM",
            hybrid=False,
            config_kwargs=dict(
                _COMMON, num_hidden_layers=3, num_key_value_heads=HEADS,
                intermediate_size=MLA_MLP, first_k_dense_replace=3,
                moe_intermediate_size=256, n_shared_experts=1, n_routed_experts=2,
                num_experts_per_tok=2,
                kv_lora_rank=MLA_KV_LORA_RANK, q_lora_rank=None,
                qk_rope_head_dim=MLA_QK_ROPE_HEAD_DIM, qk_nope_head_dim=2 * HEAD_DIM,
                v_head_dim=2 * HEAD_DIM,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            ),
            steps=3200, batch_size=32, lr=1e-3, init="prev-token",
        ),
        ZooSpec(
            # A draft for speculative decoding of tiny-llama-gsm (vLLM's draft_model method):
            # same tokenizer and vocabulary, half the width, two layers (the fewest an induction
            # lookup needs), the same head_dim and KV heads, so its KV pages match the target's
            # and a P/D pair moves them alongside. Trained on CPU in minutes (docs/zoo.md).
            name="tiny-llama-gsm-draft",
            architecture="LlamaForCausalLM",
            hybrid=False,
            config_kwargs=dict(_COMMON, hidden_size=DRAFT_HIDDEN, num_hidden_layers=DRAFT_LAYERS,
                               num_attention_heads=KV_HEADS, head_dim=HEAD_DIM,
                               intermediate_size=DRAFT_MLP,
                               rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
            # the schedule the committed weights ran: 400 planned, cut to 116 by the 840 s time
            # limit on the shared 2-core host (decay from 90), all on the short-list curriculum
            steps=116, decay_start=90, batch_size=16, lr=3e-3, warmup=30, curriculum_steps=200,
            init="prev-token",
        ),
        ZooSpec(
            # An EAGLE head for tiny-llama-gsm (vLLM's eagle method, harness/zoo/eagle.py): fc
            # over [embedding, target hidden state] and one Llama decoder layer of the target's
            # width, heads and MLP; the embedding and lm_head are the target's (not in the
            # checkpoint). Its one attention layer has the target's KV page, so a P/D pair moves
            # it with the target's layers. Trained with the target frozen (docs/zoo.md).
            name="tiny-llama-gsm-eagle",
            architecture="LlamaForCausalLM",
            hybrid=False,
            config_kwargs=dict(_COMMON, num_hidden_layers=EAGLE_LAYERS, head_dim=HEAD_DIM,
                               intermediate_size=MLP,
                               rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
            # the schedule the committed weights ran on the 2-core CPU host: 240 planned, cut
            # to 229 by the 420 s time limit (decay from 180); short price lists until step 180
            steps=240, decay_start=180, stop_after=229, batch_size=16, lr=2e-3, warmup=20,
            curriculum_steps=180, recipe="eagle-head", target="tiny-llama-gsm",
        ),
        ZooSpec(
            # tiny-qwen3next-hybrid-gsm with an MTP head (vLLM's mtp method,
            # harness/zoo/mtp.py): the target's weights unchanged plus mtp.* (fc over the normed
            # [embedding, target hidden state], one full-attention Qwen3-Next layer with the
            # target's MoE, a final norm), num_nextn_predict_layers 1. vLLM's mtp method reads
            # the head from the target's own checkpoint, so it is a model of its own; its one
            # attention layer has the target's KV page. Trained with the target frozen.
            name="tiny-qwen3next-hybrid-gsm-mtp",
            architecture="Qwen3NextForCausalLM",
            hybrid=True,
            config_kwargs=dict(_QWEN3NEXT, num_nextn_predict_layers=MTP_LAYERS),
            # the schedule the committed weights ran on the 2-core CPU host: 240 planned, cut
            # to 225 by the 420 s time limit (decay from 180); short price lists until step 180
            steps=240, decay_start=180, stop_after=225, batch_size=16, lr=2e-3, warmup=20,
            curriculum_steps=180, recipe="mtp-head", target="tiny-qwen3next-hybrid-gsm",
        ),
    )
}


def get_spec(name: str) -> ZooSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(SPECS)}") from None
