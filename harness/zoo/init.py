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
"""
from __future__ import annotations

import math

INIT_CHOICES = ("default", "prev-token")


def add_previous_token_head(model, *, layer: int = 0, kv_head: int = 0, pairs: int = 8,
                            gap: float = 8.0, constant_scale: float = 16.0) -> dict:
    """Rewrite `model`'s initial weights in place; returns what was set (for training.json)."""
    import torch

    config = model.config
    if config.architectures and config.architectures[0] != "LlamaForCausalLM":
        raise ValueError("the previous-token init is written for LlamaForCausalLM (RoPE, no QK-norm)")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    half = head_dim // 2
    base = (getattr(config, "rope_parameters", None) or {}).get("rope_theta") or getattr(
        config, "rope_theta", 10000.0)
    thetas = [base ** (-2 * j / head_dim) for j in range(pairs)]
    # sum_j (1 - cos theta_j): how much the neighbours lose against the previous token
    margin = sum(1 - math.cos(t) for t in thetas)

    emb = model.get_input_embeddings().weight
    attn = model.model.layers[layer].self_attn
    with torch.no_grad():
        std = float(emb[:, 1:].std())
        emb[:, 0] = constant_scale * std
        # the constant component after RMSNorm (weight 1 at init), averaged over the vocabulary
        rms = emb.pow(2).mean(dim=1).sqrt()
        h0 = float((emb[:, 0] / rms).mean())
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
