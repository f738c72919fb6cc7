"""The zoo's MTP head (harness/zoo/mtp.py): the committed checkpoint is the target's unchanged plus
the head's weights under the names vLLM's Qwen3NextMTP loader reads, and the head computes what
that model computes from the same modules. Evidence that vLLM serves it and that its KV crosses
P/D comes from the real cells (results/reference/cpu-mtp-20261208)."""
from __future__ import annotations

import json

import pytest

from harness.zoo import eagle, mtp, registry
from harness.zoo.models import get_spec

torch = pytest.importorskip("torch")

NAME = "tiny-qwen3next-hybrid-gsm-mtp"
TARGET = "tiny-qwen3next-hybrid-gsm"


def config() -> dict:
    return json.loads((registry.checkpoint_dir(NAME) / "config.json").read_text())


def test_the_checkpoint_is_the_target_unchanged_plus_the_head_under_mtp():
    from safetensors.torch import load_file

    ours, target = config(), json.loads((registry.checkpoint_dir(TARGET) / "config.json")
                                        .read_text())
    assert ours.pop("num_nextn_predict_layers") == 1
    assert ours == target          # the target's config otherwise: the same model served alone
    weights = load_file(str(registry.checkpoint_dir(NAME) / "model.safetensors"))
    base = load_file(str(registry.checkpoint_dir(TARGET) / "model.safetensors"))
    head = {k: v for k, v in weights.items() if k.startswith("mtp.")}
    assert set(weights) == set(base) | set(head)
    assert all(torch.equal(weights[k], v) for k, v in base.items())
    expected = {k: tuple(v.shape) for k, v in mtp.checkpoint_weights(
        mtp.build_head(config())).items()}
    assert {k: tuple(v.shape) for k, v in head.items()} == expected
    # vLLM's names: per-expert projections, the two pre-fc norms, the final norm
    for name in ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight",
                 "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
                 "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.mlp.gate.weight",
                 "mtp.layers.0.mlp.experts.1.up_proj.weight",
                 "mtp.layers.0.mlp.shared_expert_gate.weight"):
        assert name in head, name
    assert head["mtp.fc.weight"].shape == (256, 512)
    assert {v.dtype for v in weights.values()} == {torch.bfloat16}
    assert json.loads((registry.checkpoint_dir(NAME) / "training.json").read_text())[
        "target"] == get_spec(NAME).target == TARGET


def test_the_experts_split_gate_first_as_transformers_fuses_them():
    """transformers keeps an expert's gate and up projections in one tensor, gate first
    (chunk(2) of its output); the checkpoint keeps vLLM's one tensor each."""
    torch.manual_seed(0)
    head = mtp.build_head(config())
    fused = head.layers[0].mlp.experts.gate_up_proj
    fused.data.normal_()
    weights = mtp.checkpoint_weights(head)
    half = fused.shape[1] // 2
    for e in range(fused.shape[0]):
        assert torch.equal(weights[f"mtp.layers.0.mlp.experts.{e}.gate_proj.weight"],
                           fused[e, :half])
        assert torch.equal(weights[f"mtp.layers.0.mlp.experts.{e}.up_proj.weight"],
                           fused[e, half:])
    x = torch.randn(3, fused.shape[2])
    gate, up = torch.nn.functional.linear(x, fused[0]).chunk(2, dim=-1)
    assert torch.allclose(gate, x @ weights["mtp.layers.0.mlp.experts.0.gate_proj.weight"].T)
    assert torch.allclose(up, x @ weights["mtp.layers.0.mlp.experts.0.up_proj.weight"].T)
    assert not [k for k in weights if "rotary" in k]


def test_the_head_normalises_both_inputs_and_is_causal():
    torch.manual_seed(0)
    head = mtp.build_head(config()).double()
    for p in head.parameters():
        p.data.normal_(0, 0.05)
    embeds = torch.randn(2, 7, 256, dtype=torch.float64)
    hidden = torch.randn(2, 7, 256, dtype=torch.float64)
    out = head(embeds, hidden)
    assert out.shape == (2, 7, 256)
    # pre_fc_norm_*: the scale of either input does not matter, its direction does
    assert torch.allclose(head(embeds * 3.0, hidden * 0.5), out, atol=1e-5)   # norms in fp32
    assert not torch.allclose(head(embeds, hidden + 0.1), out, atol=1e-5)
    changed = hidden.clone()
    changed[:, 5:] += 1.0
    assert torch.allclose(head(embeds, changed)[:, :5], out[:, :5], atol=1e-6)


def test_the_losses_draft_two_ahead_with_the_shared_trainer():
    from tests.zoo.test_eagle import assert_losses_on_one_test_batch

    assert_losses_on_one_test_batch(mtp.build_head(config()), TARGET, NAME)
    assert mtp.MTP.recipe == get_spec(NAME).recipe and mtp.MTP.probe_key == "mtp_probe"


def test_a_seed_gives_the_same_head_and_every_weight_is_initialised():
    """transformers leaves the routed experts to its model's init (torch.empty): the head inits
    them itself, so the trainer's seed fixes the whole head."""
    torch.manual_seed(0)
    a = mtp.build_head(config())
    torch.manual_seed(0)
    b = mtp.build_head(config())
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name
    experts = a.layers[0].mlp.experts
    for weight in (experts.gate_up_proj, experts.down_proj, a.layers[0].mlp.gate.weight):
        assert 0.015 < float(weight.detach().std()) < 0.025
