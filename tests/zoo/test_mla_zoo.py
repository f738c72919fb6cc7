"""tiny-mla-gsm: the spec (DeepseekV2, a 576-wide latent, <= 10 MB of bf16), the MLA
previous-token init (harness/zoo/init.py) and the zeroed-latent probe hook (harness/zoo/probe.py)."""
from __future__ import annotations

import pytest

from harness.zoo.models import get_spec

NAME = "tiny-mla-gsm"
MAX_WEIGHT_BYTES = 10 * 1000 * 1000
SEQ = 64


def _model(init: bool, seed: int = 0):
    import torch
    import transformers

    from harness.zoo.init import add_previous_token_head

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        get_spec(NAME).make_config(), attn_implementation="eager")
    info = add_previous_token_head(model) if init else None
    return model.eval(), info


def _layer0_attention(model, seq: int = SEQ):
    import torch

    ids = torch.randint(5, 700, (1, seq), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(input_ids=ids, output_attentions=True).attentions[0][0]   # [heads, q, k]


def test_spec_builds_a_dense_deepseek_v2_with_the_576_latent_vllm_cpu_runs():
    import torch
    import transformers

    from harness.core.kv_geometry import geometry_from_config
    from harness.zoo.registry import is_hybrid, required_block_size

    spec = get_spec(NAME)
    config = spec.make_config()
    assert config.architectures == ["DeepseekV2ForCausalLM"] and spec.init == "prev-token"
    assert config.kv_lora_rank + config.qk_rope_head_dim == 576
    assert config.q_lora_rank is None and config.first_k_dense_replace == config.num_hidden_layers
    assert config.num_key_value_heads == config.num_attention_heads
    geometry = geometry_from_config(config.to_dict(), "bfloat16")      # what the matrix reads
    assert geometry.latent and geometry.head_dim == 576 and geometry.kv_heads == 1
    assert not is_hybrid(NAME) and required_block_size(NAME) is None
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert not any("experts" in n or ".gate." in n for n, _ in model.named_parameters())
    assert 2 * sum(p.numel() for p in model.parameters()) <= MAX_WEIGHT_BYTES


def test_mla_prev_token_init_makes_head_0_attend_to_the_previous_token():
    import torch

    model, info = _model(init=True)
    assert info["init"] == "prev-token" and info["attention"] == "mla" and info["weight"] > 0
    attn = _layer0_attention(model)
    pos = torch.arange(1, SEQ)
    argmax = attn[0, 1:].argmax(dim=-1)
    assert float((argmax == pos - 1).float().mean()) >= 0.98
    assert float(attn[0, pos, pos - 1].mean()) > 0.9
    # the other heads' q_pe stay random: no previous-token preference
    for head in (1, 2, 3):
        assert float((attn[head, 1:].argmax(dim=-1) == pos - 1).float().mean()) < 0.3


def test_default_init_has_no_previous_token_head():
    import torch

    model, _ = _model(init=False)
    attn = _layer0_attention(model)
    pos = torch.arange(1, SEQ)
    for head in range(attn.shape[0]):
        assert float((attn[head, 1:].argmax(dim=-1) == pos - 1).float().mean()) < 0.3


def test_mla_init_writes_only_head_0_queries_and_the_rope_key():
    import torch

    before, _ = _model(init=False)
    after, info = _model(init=True)
    config = after.config
    old = before.model.layers[0].self_attn
    new = after.model.layers[0].self_attn
    qk = config.qk_nope_head_dim + config.qk_rope_head_dim
    # other heads' queries and the compressed-kv rows are untouched
    assert torch.equal(old.q_proj.weight[qk:], new.q_proj.weight[qk:])
    assert torch.equal(old.kv_a_proj_with_mqa.weight[:config.kv_lora_rank],
                       new.kv_a_proj_with_mqa.weight[:config.kv_lora_rank])
    # head 0: only the real parts of its first `pairs` q_pe pairs, read from hidden dim 0
    q0 = new.q_proj.weight[:qk]
    nonzero = {tuple(i) for i in q0.nonzero().tolist()}
    assert nonzero == {(config.qk_nope_head_dim + 2 * j, 0) for j in range(info["pairs"])}
    k_pe = new.kv_a_proj_with_mqa.weight[config.kv_lora_rank:]
    assert {r for r, c in k_pe.nonzero().tolist()} <= set(range(2 * info["pairs"]))
    assert not k_pe[:, 1:].any()


def test_zeroed_kv_zeroes_the_mla_latent_block_in_the_cache():
    import torch

    from harness.zoo.probe import zeroed_kv

    model, _ = _model(init=True)
    ids = torch.randint(5, 700, (2, 40))
    with torch.no_grad(), zeroed_kv(model, 40, [(8, 24), None]):
        cache = model(input_ids=ids, use_cache=True).past_key_values
    for layer in cache.layers:                 # keys: the normed latent, values: the roped k_pe
        for t in (layer.keys, layer.values):
            assert not t[0, :, 8:24].any()
            assert t[0, :, :8].any() and t[0, :, 24:].any() and t[1, :, 8:24].any()


def test_init_refuses_an_mla_model_with_q_lora():
    import dataclasses

    import transformers

    from harness.zoo.init import add_previous_token_head

    spec = get_spec(NAME)
    spec = dataclasses.replace(spec, config_kwargs={**spec.config_kwargs, "q_lora_rank": 64,
                                                    "num_hidden_layers": 1,
                                                    "first_k_dense_replace": 1})
    model = transformers.AutoModelForCausalLM.from_config(spec.make_config())
    with pytest.raises(ValueError, match="q_lora_rank"):
        add_previous_token_head(model)
