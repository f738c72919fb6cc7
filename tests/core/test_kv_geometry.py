"""KV bytes per token from config.json: the zoo models' numbers, and every case it refuses."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.core.kv_geometry import GeometryUnknown, geometry_from_config

ZOO = Path(__file__).resolve().parents[2] / "harness" / "zoo" / "checkpoints"


def zoo_config(name: str) -> dict:
    return json.loads((ZOO / name / "config.json").read_text())


def test_dense_llama_bytes_per_token():
    g = geometry_from_config(zoo_config("tiny-llama-gsm"), "bfloat16")
    # 4 layers x K,V x 2 KV heads x head dim 64 x 2 bytes
    assert (g.attention_layers, g.kv_heads, g.head_dim, g.state_layers) == (4, 2, 64, 0)
    assert g.attention_bytes_per_token == 2048


@pytest.mark.parametrize("name", ["tiny-granite-hybrid-gsm", "tiny-qwen3next-hybrid-gsm"])
def test_hybrid_counts_attention_and_state_layers_apart(name):
    g = geometry_from_config(zoo_config(name), "bfloat16")
    assert (g.attention_layers, g.state_layers) == (2, 1)
    assert g.attention_bytes_per_token == 1024


def test_head_dim_defaults_to_hidden_over_heads_and_dtype_changes_bytes():
    cfg = {"num_attention_heads": 8, "num_key_value_heads": 8, "hidden_size": 512,
           "num_hidden_layers": 2}
    assert geometry_from_config(cfg, "float32").attention_bytes_per_token == 2 * 2 * 8 * 64 * 4
    assert geometry_from_config(cfg, "float16").attention_bytes_per_token == 2 * 2 * 8 * 64 * 2


@pytest.mark.parametrize("cfg, dtype, args, reason", [
    ({"kv_lora_rank": 512}, "bfloat16", (), "MLA"),
    ({"sliding_window": 64}, "bfloat16", (), "sliding-window"),
    ({}, "int4", (), "dtype"),
    ({}, "bfloat16", ("--kv-cache-dtype=fp8",), "kv-cache-dtype"),
    ({"num_hidden_layers": None}, "bfloat16", (), "lacks"),
    ({"layer_types": ["attention", "moe_router"]}, "bfloat16", (), "not modelled"),
])
def test_geometry_it_cannot_state_exactly_is_refused_with_a_reason(cfg, dtype, args, reason):
    base = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
            "num_hidden_layers": 2}
    with pytest.raises(GeometryUnknown, match=reason):
        geometry_from_config({**base, **cfg}, dtype, args)


def test_mla_caches_one_latent_vector_per_token_and_layer():
    from harness.zoo.random_mla import config_kwargs

    g = geometry_from_config(config_kwargs(), "bfloat16")
    assert g.latent and (g.attention_layers, g.head_dim) == (2, 512 + 64)
    assert g.attention_bytes_per_token == 2 * 576 * 2          # no K/V pair, no heads
    with pytest.raises(GeometryUnknown, match="latent size"):
        geometry_from_config({"num_hidden_layers": 2, "use_mla": True}, "bfloat16")


def test_a_disabled_sliding_window_is_full_attention():
    cfg = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
           "num_hidden_layers": 2, "sliding_window": 4096, "use_sliding_window": False}
    assert geometry_from_config(cfg, "bfloat16").attention_layers == 2


def test_the_sliding_window_zoo_model_counts_its_sliding_layers():
    import json

    from harness.zoo import registry

    config = json.loads((registry.CHECKPOINTS_DIR / "tiny-llama-swa-gsm" / "config.json").read_text())
    g = geometry_from_config(config, "bfloat16")
    assert (g.attention_layers, g.sliding_layers, g.state_layers) == (4, 2, 0)
    assert g.attention_bytes_per_token == 4 * 2 * 2 * 64 * 2
    hybrid = {**config, "layer_types": ["sliding_attention", "mamba", "full_attention",
                                        "full_attention"]}
    with pytest.raises(GeometryUnknown, match="hybrid"):
        geometry_from_config(hybrid, "bfloat16")


def test_a_draft_model_of_the_same_page_adds_its_layers():
    """tiny-llama-gsm-draft: 2 layers of the target's 2 KV heads x 64, so each token's KV grows
    from 4 to 6 layers (2,048 -> 3,072 bytes in bf16, 1,536 in fp8)."""
    from harness.core.kv_geometry import with_draft

    draft = geometry_from_config(zoo_config("tiny-llama-gsm-draft"), "bfloat16")
    g = with_draft(geometry_from_config(zoo_config("tiny-llama-gsm"), "bfloat16"), draft)
    assert (g.attention_layers, g.draft_layers, g.attention_bytes_per_token) == (6, 2, 3072)
    fp8 = with_draft(geometry_from_config(zoo_config("tiny-llama-gsm"), "bfloat16", kv_cache_dtype="fp8"),
                     geometry_from_config(zoo_config("tiny-llama-gsm-draft"), "bfloat16",
                                          kv_cache_dtype="fp8"))
    assert fp8.attention_bytes_per_token == 1536
    with pytest.raises(GeometryUnknown, match="its own KV cache group"):
        with_draft(geometry_from_config(zoo_config("tiny-mla-gsm"), "bfloat16"), draft)
