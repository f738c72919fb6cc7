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


def test_an_eagle_head_adds_its_one_layer():
    """tiny-llama-gsm-eagle: one decoder layer of the target's 2 KV heads x 64, read from the
    head's config.json like a draft model's: 5 layers a token, 2,560 bytes in bf16."""
    from harness.core.kv_geometry import with_draft

    head = geometry_from_config(zoo_config("tiny-llama-gsm-eagle"), "bfloat16")
    g = with_draft(geometry_from_config(zoo_config("tiny-llama-gsm"), "bfloat16"), head)
    assert (g.attention_layers, g.draft_layers, g.attention_bytes_per_token) == (5, 1, 2560)


def test_an_mtp_head_is_read_from_the_targets_own_checkpoint():
    """tiny-qwen3next-hybrid-gsm-mtp: the hybrid's 2 attention + 1 GDN layers, and, read as
    the drafter (vLLM's mtp method), its num_nextn_predict_layers = 1 full-attention layer of
    the same 2 KV heads x 64: 3 attention layers a token, 1,536 bytes in bf16; the groups stay
    unpadded (size 1: 3 full, 1 state)."""
    from harness.core.kv_geometry import draft_geometry, with_draft

    config = zoo_config("tiny-qwen3next-hybrid-gsm-mtp")
    target = geometry_from_config(config, "bfloat16")
    assert (target.attention_layers, target.state_layers) == (2, 1)
    head = draft_geometry(config, "bfloat16")
    assert (head.attention_layers, head.kv_heads, head.head_dim, head.state_layers) == (1, 2, 64, 0)
    g = with_draft(target, head)
    assert (g.attention_layers, g.draft_layers, g.state_layers) == (3, 1, 1)
    assert g.attention_bytes_per_token == 1536 and not g.padded
    assert [(x.kind, x.layers, x.slots) for x in g.cache_groups] == [("full", 1, 1)] * 3 + [
        ("state", 1, 1)]
    # a checkpoint without MTP layers is a draft of its own layers (a draft model, an EAGLE head)
    eagle = zoo_config("tiny-llama-gsm-eagle")
    assert draft_geometry(eagle, "bfloat16") == geometry_from_config(eagle, "bfloat16")
    with pytest.raises(GeometryUnknown, match="MTP layers of an MLA"):
        draft_geometry(dict(zoo_config("tiny-mla-gsm"), num_nextn_predict_layers=1), "bfloat16")


# ---- vLLM's KV cache groups (uniform page size) ---------------------------------------------

def slots(groups) -> list[tuple[str, int, int]]:
    return [(g.kind, g.layers, g.slots) for g in groups]


def test_kv_cache_groups_copy_vllms_uniform_page_grouping():
    from harness.core.kv_geometry import kv_cache_groups

    # gemma-3-4b: 5 full + 29 sliding -> groups of 5 (the smallest kind), 6 sliding groups, the
    # last holding layers 5, 11, 17, 23 and one padding slot: 35 slots for 34 layers
    gemma = kv_cache_groups({"full": 5, "sliding": 29})
    assert slots(gemma) == [("full", 5, 5)] + [("sliding", 5, 5)] * 5 + [("sliding", 4, 5)]
    assert sum(g.slots for g in gemma) == 35
    # tiny-llama-swa-gsm: two groups of two, nothing padded
    assert slots(kv_cache_groups({"full": 2, "sliding": 2})) == [("full", 2, 2), ("sliding", 2, 2)]
    # vLLM's own example (gpt-oss-20b + eagle): 13 < 1.5 x 12, so groups of 13, sliding padded
    assert slots(kv_cache_groups({"sliding": 12, "full": 13})) == [("sliding", 12, 13), ("full", 13, 13)]
    # 7 < 1.5 x 5: groups of 7, the full one padded; 7 >= 1.5 x 4: groups of 4, and a kind
    # of 7 spreads its layers i::2 over two groups, 4 and 3
    assert slots(kv_cache_groups({"full": 5, "sliding": 7})) == [("full", 5, 7), ("sliding", 7, 7)]
    assert slots(kv_cache_groups({"full": 4, "sliding": 7}))[1:] == [("sliding", 4, 4), ("sliding", 3, 4)]
    # one kind: one group of every layer; no layers: no group
    assert slots(kv_cache_groups({"full": 28, "sliding": 0})) == [("full", 28, 28)]
    assert kv_cache_groups({}) == ()


def test_the_geometry_of_gemma_3_4b_spans_35_layer_slots():
    g = geometry_from_config(json.loads((ZOO / "shape-gemma-3-4b" / "config.json").read_text()),
                             "bfloat16")
    assert (g.attention_layers, g.sliding_layers, g.layer_bytes_per_token) == (34, 29, 4096)
    assert len(g.cache_groups) == 7 and {x.slots for x in g.cache_groups} == {5} and g.padded
    assert not geometry_from_config(zoo_config("tiny-llama-swa-gsm"), "bfloat16").padded


@pytest.mark.parametrize("name", ["tiny-granite-hybrid-gsm", "tiny-qwen3next-hybrid-gsm",
                                  "shape-granite-4.0-h-tiny"])
def test_the_recurrent_hybrids_measured_are_not_padded(name):
    g = geometry_from_config(zoo_config(name), "bfloat16")
    assert g.state_layers and not g.padded


def test_a_recurrent_hybrid_with_padded_groups_is_refused():
    """3 attention + 2 mamba layers: groups of 2, the second attention group padded; which of
    its slots the connector reads with the state was never measured."""
    cfg = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
           "num_hidden_layers": 5,
           "layer_types": ["attention", "mamba", "attention", "mamba", "attention"]}
    with pytest.raises(GeometryUnknown, match=r"padded \(full 2/2, full 1/2, state 2/2"):
        geometry_from_config(cfg, "bfloat16")
