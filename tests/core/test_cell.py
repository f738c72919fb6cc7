"""Cell identity: readable ids, shared-baseline keys, and a lossless dict round trip."""
from __future__ import annotations

import json

import pytest

from harness.core.cell import Cell

SMOKE = Cell(model="tiny-llama-gsm")


def test_cell_id_of_the_cpu_smoke_cell():
    assert SMOKE.cell_id == "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1"


def test_cell_id_names_runner_backend_blocks_model_and_tp():
    cell = Cell(model="/models/Qwen3-0.6B", runner="v2", backend="FLASHINFER",
                prefill_block_size=16, decode_block_size=64, device="cuda",
                kv_buffer_device="cuda", prefill_tp=2, decode_tp=1)
    assert cell.cell_id == "v2-FLASHINFER-p16d64-Qwen3-0.6B-tp2x1"


def test_cell_id_optional_parts_appear_only_when_set():
    cell = Cell(model="/m/x/", model_tag="tag", num_prefill=2, device="cuda",
                kv_buffer_device="cpu", fault="drop-transfer")
    parts = cell.cell_id.split("-")
    assert "tag" in parts and "x" not in parts          # model_tag wins over the path
    assert "n2x1" in parts
    assert cell.cell_id.endswith("-kvbuf-cpu-fault-drop-transfer")
    # on CPU the buffer is always on the CPU: no suffix
    assert "kvbuf" not in Cell(model="m", kv_buffer_device="cpu").cell_id


def test_cell_id_extras_hash_is_stable_and_distinguishes_extras():
    a = Cell(model="m", extra_args=("--enforce-eager",))
    b = Cell(model="m", extra_args=("--enforce-eager",))
    c = Cell(model="m", extra_env=(("VLLM_X", "1"),))
    assert a.cell_id == b.cell_id
    assert a.cell_id != c.cell_id != SMOKE.cell_id
    suffix = a.cell_id.split("-")[-1]
    assert suffix.startswith("x") and len(suffix) == 7


@pytest.mark.parametrize("changes", [
    {"prefill_block_size": 16},
    {"fault": "corrupt-block"},
    {"num_prefill": 2},
    {"prefill_tp": 2},
    {"kv_buffer_device": "cuda"},
    {"expected_failure": "known upstream bug"},
])
def test_baseline_key_ignores_pd_only_settings(changes):
    assert SMOKE.replace(**changes).baseline_key == SMOKE.baseline_key


@pytest.mark.parametrize("changes", [
    {"decode_block_size": 16},
    {"model": "other-model"},
    {"backend": "TRITON_ATTN"},
    {"runner": "v2"},
    {"decode_tp": 2},
    {"dtype": "float16"},
    {"extra_args": ("--enforce-eager",)},
])
def test_baseline_key_changes_with_what_the_baseline_runs(changes):
    assert SMOKE.replace(**changes).baseline_key != SMOKE.baseline_key


def test_to_dict_from_dict_round_trip_through_json():
    cell = Cell(model="/m/qwen", model_tag="qwen", runner="v2", backend="FLASH_ATTN",
                prefill_block_size=16, decode_block_size=32, device="cuda",
                kv_buffer_device="cuda", num_prefill=2, extra_args=("--a", "1"),
                extra_env=(("A", "1"), ("B", "2")), fault="swap-blocks",
                expected_failure="upstream #1")
    data = json.loads(json.dumps(cell.to_dict()))
    assert data["id"] == cell.cell_id
    assert data["extra_env"] == {"A": "1", "B": "2"}
    back = Cell.from_dict(data)
    assert back == cell
    assert back.cell_id == cell.cell_id and back.baseline_key == cell.baseline_key


def test_from_dict_ignores_unknown_keys_and_accepts_env_pairs():
    cell = Cell.from_dict({"model": "m", "id": "ignored", "unknown": 1,
                           "extra_env": [["B", 2], ["A", "1"]]})
    assert cell.extra_env == (("A", "1"), ("B", "2"))


def test_cell_is_frozen():
    with pytest.raises(Exception):
        SMOKE.model = "other"  # type: ignore[misc]


def test_canaries_share_the_baseline_and_the_pair_of_their_clean_cell():
    """A server-side canary's fault arrives with each of its requests (the decode's plugin reads
    it from the request id), so it runs on its clean cell's pair: no servers of its own."""
    from harness.serve.deploy import pair_key

    plain = Cell(model="m", fault="corrupt-block")
    last = Cell(model="m", fault="corrupt-block",
                extra_env=(("PD_ACCURACY_FAULT_BLOCK", "last"),))
    real = Cell(model="m")
    assert last.baseline_key == plain.baseline_key == real.baseline_key
    assert pair_key(last) == pair_key(plain) == pair_key(real)
    assert pair_key(real.replace(decode_block_size=64)) != pair_key(real)
    assert last.cell_id == plain.cell_id + "-last"
    # any other env is part of what the baseline runs
    assert Cell(model="m", extra_env=(("VLLM_X", "1"),)).baseline_key != real.baseline_key


def test_two_host_network_is_in_the_id_but_shares_the_baseline():
    local = Cell(model="m")
    netns = Cell(model="m", network="netns")
    assert netns.cell_id == local.cell_id + "-netns"
    assert "netns" not in local.cell_id
    assert netns.baseline_key == local.baseline_key    # the baseline runs on one host either way
