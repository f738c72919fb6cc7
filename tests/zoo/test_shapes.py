"""The real-shape random-weight models: their committed config.json keeps every KV-relevant fact
of the published config (tests/data/model_configs/), they resolve to random weights, and their
servers get --load-format dummy."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.core.model_config import decoder_config, facts_from_config, read_config
from harness.serve.launch.models import resolve
from harness.serve.launch.server_spec import ServerSpec, build_argv
from harness.zoo import registry, shapes

PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "model_configs"
SOURCES = {"shape-qwen3-0.6b": "Qwen3-0.6B", "shape-granite-4.0-h-tiny": "granite-4.0-h-tiny",
           "shape-deepseek-v2-lite": "DeepSeek-V2-Lite-Chat", "shape-gemma-3-4b": "gemma-3-4b-it"}
# the facts the KV, its geometry and the rules depend on
KV_FACTS = ("kind", "ssm", "family", "num_kv_heads", "head_dim", "sliding_window", "attention",
            "attention_layers", "kv_lora_rank", "qk_rope_head_dim", "state_page",
            "max_position_embeddings")


def committed(name: str) -> dict:
    return read_config(registry.checkpoint_dir(name) / "config.json")


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_a_shape_keeps_the_published_kv_facts(name):
    ours = facts_from_config(name, committed(name))
    published = facts_from_config(name, read_config(PUBLISHED / f"{SOURCES[name]}.json"))
    assert {k: ours.get(k) for k in KV_FACTS} == {k: published.get(k) for k in KV_FACTS}
    ours_text = decoder_config(committed(name))
    theirs = decoder_config(read_config(PUBLISHED / f"{SOURCES[name]}.json"))
    assert ours_text["num_hidden_layers"] == theirs["num_hidden_layers"]
    assert ours_text["num_attention_heads"] == theirs["num_attention_heads"]
    assert ours_text["hidden_size"] == theirs["hidden_size"]


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_the_committed_config_is_what_the_shape_builds(name):
    assert committed(name) == json.loads(json.dumps(shapes.SHAPES[name].config()))
    assert committed(name)["vocab_size"] == shapes.TOKENIZER_VOCAB


def test_the_vocabulary_is_the_tokenizers_every_sampled_id_decodes():
    tok = json.loads((registry.checkpoint_dir("shape-qwen3-0.6b") / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) == shapes.TOKENIZER_VOCAB


def test_a_shape_resolves_to_random_weights_and_its_servers_load_dummy_weights(tmp_path):
    model = resolve("shape-qwen3-0.6b")
    assert model.random_weights and model.load_format == "dummy" and model.local
    spec = ServerSpec(role="baseline", index=0, model_path=model.path, served_model_name="m",
                      port=1, backend="FLASH_ATTN", block_size=128, device="cuda",
                      load_format=model.load_format)
    argv = build_argv(spec)
    assert argv[argv.index("--load-format") + 1] == "dummy"
    # a checkpoint with weights: vLLM loads them
    assert not resolve("tiny-llama-gsm").random_weights
    assert "--load-format" not in build_argv(ServerSpec(
        role="baseline", index=0, model_path="/m", served_model_name="m", port=1,
        backend="FLASH_ATTN", block_size=128, device="cuda"))
    # a copy at a path of its own: the same fact, from the directory
    copy = tmp_path / "my-qwen3"
    copy.mkdir()
    (copy / "config.json").write_text(json.dumps(committed("shape-qwen3-0.6b")))
    assert resolve(str(copy)).random_weights
    (copy / "model.safetensors").write_bytes(b"")
    assert not resolve(str(copy)).random_weights


def test_shapes_answer_the_zoo_task():
    from harness.eval.task_choice import default_task
    assert default_task(resolve("shape-gemma-3-4b")) == "gsm_synth"


def test_a_shape_server_gets_the_kv_budget_its_requests_need_unless_the_run_sets_one(tmp_path):
    from harness.run.plan.group_plan import GroupPlanner
    from harness.core.options import RunOptions
    from harness.core.cell import Cell
    from harness.serve.deploy import DeployContext, Placement
    from harness.serve.host.ports import PortAllocator

    def planned(run_bytes):
        ctx = DeployContext(allocator=PortAllocator(lock_dir=str(tmp_path)),
                            placement=Placement.detect("shared"), log_dir=tmp_path,
                            kv_cache_bytes=run_bytes)
        planner = GroupPlanner(RunOptions(), ctx)
        cell = Cell(model="shape-qwen3-0.6b", backend="CPU_ATTN", device="cpu",
                    prefill_block_size=128, decode_block_size=128)
        group = planner.plan([cell])
        return [s.kv_cache_bytes for s in planner.pair(group, 0).specs + planner.baseline(group).specs]

    assert planned(None) == [int(1.5 * (1 << 30))] * 3
    assert planned(1 << 30) == [1 << 30] * 3
    assert shapes.kv_cache_bytes("tiny-llama-gsm") is None
