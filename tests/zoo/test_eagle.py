"""The zoo's EAGLE head (harness/zoo/eagle.py): the committed checkpoint holds what vLLM's EAGLE
loader reads, and the trainer's head computes what a Llama decoder layer without its input norm
computes (vLLM's EagleLlamaForCausalLM). Evidence that vLLM serves it and that its KV crosses
P/D comes from the real cells (results/reference/cpu-eagle-20261207)."""
from __future__ import annotations

import json

import pytest

from harness.zoo import eagle, registry
from harness.zoo.models import get_spec

torch = pytest.importorskip("torch")

NAME = "tiny-llama-gsm-eagle"


def head_config() -> dict:
    return json.loads((registry.checkpoint_dir(NAME) / "config.json").read_text())


def test_the_checkpoint_holds_eagles_weights_under_vllms_names():
    from safetensors.torch import load_file

    config = head_config()
    target = json.loads((registry.checkpoint_dir("tiny-llama-gsm") / "config.json").read_text())
    # fc takes [embedding, hidden state] of the target's width; one layer, the target's KV page
    assert config["hidden_size"] == target["hidden_size"] and config["num_hidden_layers"] == 1
    assert (config["num_key_value_heads"], config["head_dim"]) == (target["num_key_value_heads"],
                                                                  target["head_dim"])
    assert config["vocab_size"] == target["vocab_size"]
    weights = load_file(str(registry.checkpoint_dir(NAME) / "model.safetensors"))
    expected = {k: tuple(v.shape) for k, v in eagle.build_head(config).state_dict().items()}
    assert {k: tuple(v.shape) for k, v in weights.items()} == expected
    assert "fc.weight" in weights and "layers.0.self_attn.q_proj.weight" in weights
    # the embedding and lm_head are the target's (vLLM shares them); no input norm (EAGLE's)
    assert not [k for k in weights if "embed_tokens" in k or "lm_head" in k
                or "input_layernorm" in k]
    assert {v.dtype for v in weights.values()} == {torch.bfloat16}
    assert json.loads((registry.checkpoint_dir(NAME) / "training.json").read_text())[
        "target"] == get_spec(NAME).target == "tiny-llama-gsm"


def test_the_head_is_a_llama_layer_without_its_input_norm_over_fc():
    """Against transformers' own LlamaDecoderLayer (input norm replaced by identity), with the
    same weights: what vLLM's EagleLlamaForCausalLM runs."""
    import transformers
    from transformers.models.llama import modeling_llama

    config = head_config()
    torch.manual_seed(0)
    head = eagle.build_head(config).double()
    for p in head.parameters():
        p.data.normal_(0, 0.05)
    hf_config = transformers.LlamaConfig(**{k: v for k, v in config.items()
                                            if k not in ("architectures", "dtype")})
    hf_config._attn_implementation = "sdpa"
    layer = modeling_llama.LlamaDecoderLayer(hf_config, layer_idx=0).double()
    layer.input_layernorm = torch.nn.Identity()
    layer.load_state_dict({k[len("layers.0."):]: v for k, v in head.state_dict().items()
                           if k.startswith("layers.0.")})
    rotary = modeling_llama.LlamaRotaryEmbedding(hf_config)
    embeds = torch.randn(2, 7, config["hidden_size"], dtype=torch.float64)
    hidden = torch.randn(2, 7, config["hidden_size"], dtype=torch.float64)
    x = head.fc(torch.cat((embeds, hidden), dim=-1))
    positions = torch.arange(7)[None].expand(2, 7)
    out = layer(x, attention_mask=None, position_ids=positions,
                position_embeddings=rotary(x, positions))
    out = out[0] if isinstance(out, tuple) else out
    # the head rotates and normalises in float32 (as vLLM does), the reference in float64
    assert torch.allclose(head(embeds, hidden), out, atol=1e-5)
    assert not torch.allclose(head(embeds, hidden * 1.001), out, atol=1e-5)
    # causal: a later position does not change an earlier one
    changed = hidden.clone()
    changed[:, 5:] += 1.0
    assert torch.allclose(head(embeds, changed)[:, :5], head(embeds, hidden)[:, :5], atol=1e-12)


def assert_losses_on_one_test_batch(head, target_name: str, tokenizer_of: str) -> None:
    """The shared trainer's losses of ``head`` over ``target_name`` on two test lines: finite,
    and the acceptance counted over every labelled position two ahead. (The MTP head's test
    uses it too.)"""
    from harness.zoo import task
    from harness.zoo.data import IGNORE_INDEX, LineTokenCache, make_batch

    target = eagle.load_target(target_name, "cpu")
    cache = LineTokenCache(registry.checkpoint_dir(tokenizer_of) / "tokenizer.json")
    input_ids, labels = make_batch(cache, task.TEST_SEED, 0, 2, 1)
    token, feature, accepted, positions = eagle.head_losses(
        head, target, input_ids, (labels != IGNORE_INDEX).float())
    assert torch.isfinite(token) and torch.isfinite(feature) and token > 0
    assert 0 <= accepted <= positions == int((labels[:, 2:] != IGNORE_INDEX).sum())


def test_the_losses_draft_two_ahead_towards_the_targets_own_choice():
    assert_losses_on_one_test_batch(eagle.build_head(head_config()), "tiny-llama-gsm", NAME)
