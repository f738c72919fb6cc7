"""Model facts from a model's own config.json: the architectures vLLM's P/D CI runs (their
published config.json shapes, tests/data/model_configs/), vLLM's hybrid block arithmetic, bad
files, and a copy of a zoo hybrid at a path of its own judged like its zoo name."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from harness.core.catalog import ModelCatalog, ModelInfo
from harness.core.cell import Cell
from harness.core.model_config import (ModelConfigError, StatePage, facts_from_config,
                                       find_config, read_config)
from harness.matrix import check_cell, load_matrix, normalize_cell
from harness.zoo import registry

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "model_configs"


def facts(name: str) -> ModelInfo:
    return ModelInfo(**facts_from_config(name, read_config(CONFIGS / f"{name}.json")))


@pytest.mark.parametrize("name, expected", [
    ("Qwen3-0.6B", dict(kind="dense", family="qwen3", num_kv_heads=8, head_dim=128,
                        max_position_embeddings=40960, sliding_window=None, attention="mha",
                        attention_layers=28, mtp_layers=0)),
    ("granite-4.0-h-tiny", dict(kind="hybrid", ssm="mamba2", family="granite", num_kv_heads=4,
                                head_dim=128, max_position_embeddings=131072, attention_layers=4,
                                state_page=StatePage(9984, 393216))),
    # gemma-3's config.json states no head counts: transformers' Gemma3TextConfig defaults
    ("gemma-3-4b-it", dict(kind="dense", family="gemma3", num_kv_heads=4, head_dim=256,
                           sliding_window=1024, max_position_embeddings=131072,
                           attention_layers=34)),
    # MLA: one latent per token and layer, no KV heads for TP to split, no head size to check
    ("DeepSeek-V2-Lite-Chat", dict(kind="dense", attention="mla", kv_lora_rank=512,
                                   qk_rope_head_dim=64, num_kv_heads=None, head_dim=None,
                                   max_position_embeddings=163840, attention_layers=27)),
    ("Qwen3.5-0.8B", dict(kind="hybrid", ssm="gdn", family="qwen3_5", num_kv_heads=2,
                          head_dim=256, max_position_embeddings=262144, attention_layers=6,
                          mtp_layers=1, state_page=StatePage(18432, 262144))),
])
def test_facts_of_the_models_vllm_ci_runs(name, expected):
    info = facts(name)
    assert {k: getattr(info, k) for k in expected} == expected
    assert info.source == "config.json"


def test_qwen3_kv_bytes_per_token_as_the_issue_states():
    info = facts("Qwen3-0.6B")
    assert info.attention_layers * 2 * info.num_kv_heads * info.head_dim * 2 == 112 * 1024


def test_hybrid_block_arithmetic_reproduces_vllm_cpus_measured_raises():
    """vLLM CPU 0.32 logged, for the zoo Granite hybrid: 64 -> 128, 16 -> 96, 128 kept."""
    zoo = ModelInfo(**facts_from_config("g", read_config(
        registry.checkpoint_dir("tiny-granite-hybrid-gsm") / "config.json")))
    runs = {b: zoo.block_vllm_runs(b, "cpu", "bfloat16") for b in (16, 64, 96, 128)}
    assert runs == {16: 96, 64: 128, 96: 96, 128: 128}
    assert zoo.smallest_kept_block("cpu", "bfloat16") == 96


def test_granite_tiny_blocks_on_cpu_and_cuda():
    """granite-4.0-h-tiny's Mamba2 state (1,592,832 B with a float32 SSM state on CPU, 806,400 B
    in bf16 on CUDA) against 2 KiB of KV per token and attention layer."""
    g = facts("granite-4.0-h-tiny")
    assert g.smallest_kept_block("cpu", "bfloat16") == 800
    assert g.block_vllm_runs(64, "cpu", "bfloat16") == 832
    assert g.smallest_kept_block("cuda", "bfloat16") == 400
    assert g.block_vllm_runs(16, "cuda", "bfloat16") == 400
    assert facts("Qwen3-0.6B").block_vllm_runs(16, "cuda", "bfloat16") == 16


@pytest.mark.parametrize("content, expected", [
    (b"\x00\x01\xff\xfe binary", "not JSON (binary data)"),
    (b"[1, 2, 3]", "holds a JSON list, not an HF config"),
    (b"{\"architectures\": [", "is not valid JSON"),
])
def test_bad_config_is_one_line(tmp_path, content, expected):
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ModelConfigError) as info:
        read_config(find_config(str(tmp_path)), "m")
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_yaml_overrides_a_config_fact_field_by_field():
    catalog = ModelCatalog({"q": ModelInfo("q", max_position_embeddings=4096)},
                           config_facts=lambda m: facts("Qwen3-0.6B") if m == "q" else None)
    q = catalog.get("q")
    assert q.max_position_embeddings == 4096 and q.num_kv_heads == 8 and q.attention_layers == 28
    assert q.source == "config.json+matrix"
    assert catalog.get("other") == ModelInfo("other")


@pytest.fixture(scope="module")
def granite_copy(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("x") / "my-granite-h"
    shutil.copytree(registry.checkpoint_dir("tiny-granite-hybrid-gsm"), path)
    return str(path)


def test_a_copied_zoo_hybrid_gets_its_zoo_names_facts_and_rules(granite_copy):
    catalog = load_matrix().models
    zoo_name = "tiny-granite-hybrid-gsm"
    assert dataclasses.replace(catalog.get(granite_copy), name=zoo_name) == catalog.get(zoo_name)
    problems = {}
    for model in (zoo_name, granite_copy):
        cell = normalize_cell(Cell(model=model, prefill_block_size=64, decode_block_size=64), catalog)
        problems[model] = [(p.rule, p.message.replace(model, "M")) for p in check_cell(cell, None, catalog)]
    assert problems[zoo_name] == problems[granite_copy]
    assert ("hybrid-min-block-size", "M on cpu keeps no attention block below 96 (one block's KV "
            "page must hold a mamba2 layer's state page); vLLM would silently raise 64 to 128; "
            "use block_size 128") in problems[zoo_name]
    assert "granite-hybrid-cpu-prefix-caching" in dict(problems[zoo_name])


def test_copied_hybrid_dry_run_is_refused_like_its_zoo_name(granite_copy, capsys):
    from harness.cli.main import main

    lines = {}
    for model in ("tiny-granite-hybrid-gsm", granite_copy):
        assert main(["run", "--model", model, "--block-size", "64", "--dry-run"]) == 2
        err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
        assert len(err) == 1
        lines[model] = err[0].replace(granite_copy, "M").replace(Path(granite_copy).name, "M") \
            .replace("tiny-granite-hybrid-gsm", "M")
    assert lines["tiny-granite-hybrid-gsm"] == lines[granite_copy]
    assert "vLLM would silently raise 64 to 128" in lines[granite_copy]


@pytest.mark.parametrize("content, expected", [
    (b"\x89PNG\r\n\x1a\n\x00\x00", "not JSON (binary data)"),
    (json.dumps(["a", "list"]).encode(), "holds a JSON list"),
])
def test_bad_config_on_the_command_line_is_one_line_exit_2(tmp_path, capsys, content, expected):
    from harness.cli.main import main

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_bytes(content)
    assert main(["run", "--model", str(model), "--dry-run", "--results-dir", str(tmp_path / "r")]) == 2
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(err) == 1 and err[0].startswith("pd-accuracy: error: ") and expected in err[0]


def test_a_hub_id_reads_its_config_from_the_local_cache(tmp_path):
    from harness.core.model_config import hub_cache_config

    snapshot = tmp_path / "models--Qwen--Qwen3-0.6B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    shutil.copy(CONFIGS / "Qwen3-0.6B.json", snapshot / "config.json")
    (tmp_path / "models--Qwen--Qwen3-0.6B" / "refs").mkdir()
    (tmp_path / "models--Qwen--Qwen3-0.6B" / "refs" / "main").write_text("abc123")
    found = hub_cache_config("Qwen/Qwen3-0.6B", cache_dir=tmp_path)
    assert found == snapshot / "config.json"
    assert facts_from_config("Qwen/Qwen3-0.6B", read_config(found))["num_kv_heads"] == 8
    assert hub_cache_config("Qwen/not-cached", cache_dir=tmp_path) is None


@pytest.mark.parametrize("name, per_token, state_layers, sliding", [
    ("Qwen3-0.6B", 112 * 1024, 0, 0),
    ("gemma-3-4b-it", 34 * 2 * 4 * 256 * 2, 0, 34 - 34 // 6),    # 5 sliding : 1 full
    ("Qwen3.5-0.8B", 6 * 2 * 2 * 256 * 2, 18, 0),
])
def test_kv_geometry_reads_the_decoder_config(name, per_token, state_layers, sliding):
    from harness.core.kv_geometry import geometry_from_config

    g = geometry_from_config(read_config(CONFIGS / f"{name}.json"), "bfloat16")
    assert (g.attention_bytes_per_token, g.state_layers, g.sliding_layers) == (per_token, state_layers, sliding)
