"""The random MLA plumbing model: the latent KV size vLLM CPU's MLA decode kernel runs (576),
the zoo's tokenizer, deterministic weights, resolved by name like tiny-llama-random."""
from __future__ import annotations

import json

from harness.zoo import random_mla
from harness.zoo.registry import is_hybrid, resolve_model


def test_built_once_with_the_supported_latent_size_and_the_zoo_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("PD_ACCURACY_CACHE", str(tmp_path))
    path = resolve_model(random_mla.NAME)
    config = json.loads((tmp_path / "models" / random_mla.NAME / "config.json").read_text())
    assert path == str(tmp_path / "models" / random_mla.NAME)
    assert config["architectures"] == ["DeepseekV2ForCausalLM"]
    assert config["kv_lora_rank"] + config["qk_rope_head_dim"] == 576
    assert all((tmp_path / "models" / random_mla.NAME / f).exists()
               for f in random_mla.TOKENIZER_FILES)
    weights = (tmp_path / "models" / random_mla.NAME / "model.safetensors").read_bytes()
    again = random_mla.build(tmp_path / "second")
    assert (again / "model.safetensors").read_bytes() == weights       # same seed, same bytes
    assert not is_hybrid(random_mla.NAME)
