"""A previous-token attention head built into a freshly initialised Llama.

A price lookup in gsm_synth ("- badges" in the answer -> " 5", the token after "badges" in the
price list) is an induction circuit: one head copies each token's predecessor into its position,
a later head matches the current token against those copies. Trained from scratch, the tiny Llama
never found the first half in 3200 steps (it sat at loss 0.05-0.07, guessing prices, in nine recipe
variants), while the hybrids, whose convolution hands every token its predecessor, learned it.
This module writes that first half into the initial weights; training finds the rest.

Construction (RoPE, HF Llama's `rotate_half` pairs: dim j with j + head_dim/2, angle theta_j):
- every token embedding gets the same value `constant` in hidden dim 0, so after the first
  RMSNorm every position carries a near-constant component h0;
- one KV head of `layer` gets q_j = a and k_j = a * exp(i theta_j) on its `pairs` fastest
  rotary pairs (read from hidden dim 0 only), so the score of query m on key n is
  a^2 / sqrt(head_dim) * sum_j cos((m - n - 1) theta_j): largest at n = m - 1;
- `a` is set so the previous token out-scores its neighbours (n = m and n = m - 2) by `gap` logits.
The head's value/output projections stay random: they carry the previous token's identity.

DeepseekV2 (MLA, `_add_mla_previous_token_head`): the same head, built from MLA's parts. Each
query head's output of q_proj is [q_nope (qk_nope_head_dim) | q_pe (qk_rope_head_dim)];
kv_a_proj_with_mqa outputs [compressed kv (kv_lora_rank) | k_pe (qk_rope_head_dim)], and k_pe is
ONE rope key shared by all heads. HF's DeepseekV2 (and vLLM's, `is_neox_style=False`) rotates
INTERLEAVED pairs (dims 2j, 2j + 1, as view_as_complex: x_2j + i x_2j+1) by theta_j = inv_freq[j]:
- hidden dim 0 of every embedding is the same constant, as for Llama;
- query head `head` of `layer`: q_nope rows zero (no content score), q_pe pair j = (a, 0) for the
  `pairs` fastest pairs, every other q_pe row zero;
- k_pe pair j = a * (cos theta_j, sin theta_j), every other k_pe row zero (the compressed-kv
  rows stay random: they feed the values, which carry the previous token's identity).
  Score of query m on key n: scaling * a^2 * sum_j Re(e^{i m theta_j} conj(e^{i (n+1) theta_j}))
  = scaling * a^2 * sum_j cos((m - n - 1) theta_j), scaling = qk_head_dim ** -0.5: largest at
  n = m - 1, as above. The other heads' q_pe stay random; their scores against this k_pe are noise.
"""
from __future__ import annotations

import math

INIT_CHOICES = ("default", "prev-token")


def add_previous_token_head(model, *, layer: int = 0, kv_head: int = 0, pairs: int = 8,
                            gap: float = 8.0, constant_scale: float = 16.0) -> dict:
    """Rewrite `model`'s initial weights in place; returns what was set (for training.json).
    Llama: `kv_head`'s query heads look back; DeepseekV2 (MLA): query head `kv_head` does,
    through the one shared rope key."""
    import torch

    config = model.config
    arch = config.architectures[0] if config.architectures else "LlamaForCausalLM"
    if arch == "DeepseekV2ForCausalLM":
        return _add_mla_previous_token_head(model, layer=layer, head=kv_head, pairs=pairs,
                                            gap=gap, constant_scale=constant_scale)
    if arch != "LlamaForCausalLM":
        raise ValueError("the previous-token init is written for LlamaForCausalLM (RoPE, no "
                         "QK-norm) and DeepseekV2ForCausalLM (MLA), not " + arch)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    half = head_dim // 2
    base = (getattr(config, "rope_parameters", None) or {}).get("rope_theta") or getattr(
        config, "rope_theta", 10000.0)
    thetas = [base ** (-2 * j / head_dim) for j in range(pairs)]
    # sum_j (1 - cos theta_j): how much the neighbours lose against the previous token
    margin = sum(1 - math.cos(t) for t in thetas)

    attn = model.model.layers[layer].self_attn
    with torch.no_grad():
        h0 = _constant_hidden_dim0(model, constant_scale)
        amplitude = math.sqrt(gap * math.sqrt(head_dim) / margin)   # a, at the projection output
        w = amplitude / h0
        rows = slice(kv_head * head_dim, (kv_head + 1) * head_dim)
        k = attn.k_proj.weight[rows]
        k.zero_()
        for j, t in enumerate(thetas):
            k[j, 0] = w * math.cos(t)
            k[j + half, 0] = w * math.sin(t)
        group = config.num_attention_heads // config.num_key_value_heads
        for qh in range(kv_head * group, (kv_head + 1) * group):
            q = attn.q_proj.weight[qh * head_dim:(qh + 1) * head_dim]
            q.zero_()
            for j in range(pairs):
                q[j, 0] = w
        if attn.k_proj.bias is not None:
            attn.k_proj.bias[rows].zero_()
    return {"init": "prev-token", "layer": layer, "kv_head": kv_head, "pairs": pairs,
            "gap_logits": gap, "constant_scale": constant_scale, "weight": round(w, 4),
            "h0": round(h0, 3)}


def _constant_hidden_dim0(model, constant_scale: float) -> float:
    """Set hidden dim 0 of every token embedding to `constant_scale` x the embeddings' std (call
    under torch.no_grad()); returns h0, that component after RMSNorm (weight 1 at init),
    averaged over the vocabulary."""
    emb = model.get_input_embeddings().weight
    std = float(emb[:, 1:].std())
    emb[:, 0] = constant_scale * std
    rms = emb.pow(2).mean(dim=1).sqrt()
    return float((emb[:, 0] / rms).mean())


def _add_mla_previous_token_head(model, *, layer: int, head: int, pairs: int, gap: float,
                                 constant_scale: float) -> dict:
    """The DeepseekV2 (MLA) construction of the module docstring; returns what was set."""
    import torch

    config = model.config
    attn = model.model.layers[layer].self_attn
    if attn.q_proj is None:
        raise ValueError("the MLA previous-token init needs q_lora_rank None (a plain q_proj)")
    nope, rope = attn.qk_nope_head_dim, attn.qk_rope_head_dim
    qk_head_dim = nope + rope
    # theta_j as the model rotates pair j (the rotary module's inv_freq, fastest first)
    inv_freq = model.model.rotary_emb.inv_freq.detach().float().cpu()
    if len(inv_freq) != rope // 2 or pairs > len(inv_freq):
        raise ValueError(f"rotary inv_freq has {len(inv_freq)} pairs for qk_rope_head_dim {rope}")
    thetas = [float(t) for t in inv_freq[:pairs]]
    margin = sum(1 - math.cos(t) for t in thetas)

    with torch.no_grad():
        h0 = _constant_hidden_dim0(model, constant_scale)
        # score gap to the neighbours = scaling * a^2 * margin (scaling = qk_head_dim ** -0.5)
        amplitude = math.sqrt(gap / (float(attn.scaling) * margin))
        w = amplitude / h0
        q = attn.q_proj.weight[head * qk_head_dim:(head + 1) * qk_head_dim]
        q.zero_()                                  # q_nope and q_pe of this head
        for j in range(pairs):
            q[nope + 2 * j, 0] = w                 # real part of q_pe pair j
        k_rows = slice(config.kv_lora_rank, config.kv_lora_rank + rope)
        k_pe = attn.kv_a_proj_with_mqa.weight[k_rows]
        k_pe.zero_()
        for j, t in enumerate(thetas):
            k_pe[2 * j, 0] = w * math.cos(t)
            k_pe[2 * j + 1, 0] = w * math.sin(t)
        if attn.kv_a_proj_with_mqa.bias is not None:
            attn.kv_a_proj_with_mqa.bias[k_rows].zero_()
    return {"init": "prev-token", "attention": "mla", "layer": layer, "head": head,
            "key": "shared k_pe", "pairs": pairs, "gap_logits": gap,
            "constant_scale": constant_scale, "weight": round(w, 4), "h0": round(h0, 3)}
