"""The sliding-window zoo model's construction (harness/zoo/sliding.py): the base Llama's weights
in a sliding Qwen2 and back, without training (the trained checkpoint is the committed one)."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from harness.zoo import registry, sliding


BASE_DIR = registry.CHECKPOINTS_DIR / sliding.BASE


def test_config_lists_sliding_layers_and_rejects_a_wrong_count():
    base = json.loads((BASE_DIR / "config.json").read_text())
    config = sliding.qwen2_config(base)
    assert config.layer_types == list(sliding.LAYER_TYPES) and config.sliding_window == 64
    with pytest.raises(ValueError, match="3 layer types for 4 layers"):
        sliding.qwen2_config(base, layer_types=sliding.LAYER_TYPES[:3])
    served = sliding.llama_config(base)
    assert served["architectures"] == ["LlamaForCausalLM"]
    assert served["layer_types"][0] == "sliding_attention" and served["sliding_window"] == 64
    assert {k: v for k, v in served.items() if k not in ("layer_types", "sliding_window")} == {
        **base, "dtype": "bfloat16"}


def test_training_model_starts_from_the_base_weights_with_frozen_zero_biases():
    model, _ = sliding.training_model(BASE_DIR)
    base = load_file(str(BASE_DIR / "model.safetensors"))
    state = model.state_dict()
    assert all(torch.equal(state[k].to(base[k].dtype), base[k]) for k in base)
    biases = [(n, p) for n, p in model.named_parameters() if n.endswith("proj.bias")]
    assert len(biases) == 3 * 4                      # q, k, v of each of the 4 layers
    assert all(not p.requires_grad and not p.any() for _, p in biases)


def test_export_round_trips_to_the_llama_names(tmp_path):
    model, base = sliding.training_model(BASE_DIR)
    sliding.export(model, base, BASE_DIR, tmp_path)
    exported = load_file(str(tmp_path / "model.safetensors"))
    assert set(exported) == set(load_file(str(BASE_DIR / "model.safetensors")))
    assert json.loads((tmp_path / "config.json").read_text()) == sliding.llama_config(base)
    assert (tmp_path / "tokenizer.json").read_bytes() == (BASE_DIR / "tokenizer.json").read_bytes()


def test_the_committed_checkpoint_is_the_sliding_one():
    config = json.loads((registry.CHECKPOINTS_DIR / sliding.NAME / "config.json").read_text())
    assert config["layer_types"] == list(sliding.LAYER_TYPES)
    assert config["sliding_window"] == sliding.WINDOW
    trained = json.loads((registry.CHECKPOINTS_DIR / sliding.NAME / "training.json").read_text())
    assert trained["probe"]["clean"]["accuracy"] >= 0.9
