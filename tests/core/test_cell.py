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


# ---- engine settings (async scheduling, speculative decoding, prefix reuse, chunked prefill,
# CUDA-graph mode, decode KV layout) ----------------------------------------------------------

@pytest.mark.parametrize("changes,token", [
    ({"async_scheduling": "on"}, "async_on"),
    ({"async_scheduling": "off"}, "async_off"),
    ({"spec_decode": "ngram"}, "spec_ngram"),
    ({"prefix_reuse": True}, "prefix_reuse"),
    ({"chunked_prefill": 64}, "chunk64"),
    ({"cudagraph_mode": "FULL"}, "cg_FULL"),
    ({"cudagraph_mode": "PIECEWISE"}, "cg_PIECEWISE"),
    ({"cudagraph_mode": "NONE"}, "cg_NONE"),
    ({"kv_layout": "HND"}, "dlayout_HND"),
    ({"kv_layout": "NHD"}, "dlayout_NHD"),
])
def test_engine_settings_are_one_id_token_each_when_set(changes, token):
    cell = SMOKE.replace(**changes)
    assert cell.cell_id == f"{SMOKE.cell_id}-{token}"
    assert "-" not in token          # one token: report variants split ids on "-"


def test_engine_settings_at_their_defaults_leave_ids_and_baseline_keys_alone():
    explicit = SMOKE.replace(async_scheduling="default", spec_decode=None, prefix_reuse=False,
                             chunked_prefill=None, cudagraph_mode="default", kv_layout="default")
    assert explicit == SMOKE and explicit.cell_id == SMOKE.cell_id
    # the keys recorded before these axes existed (pd-accuracy list --profile smoke, 2026-12-01)
    assert Cell(model="tiny-llama-gsm", compile="eager").baseline_key.startswith("303697f9")
    assert Cell(model="tiny-llama-gsm", compile="eager", prefill_block_size=32,
                decode_block_size=32).baseline_key.startswith("c6eb5a96")


def test_engine_settings_order_in_the_id_and_before_extras_and_fault():
    cell = SMOKE.replace(compile="eager", spec_decode="ngram", prefix_reuse=True, chunked_prefill=64,
                         extra_args=("--x",), fault="corrupt-block")
    parts = cell.cell_id.split("-")
    i = parts.index("eager")
    assert parts[i + 1:i + 4] == ["spec_ngram", "prefix_reuse", "chunk64"]
    assert parts[i + 4].startswith("x") and parts[i + 5:] == ["fault", "corrupt", "block"]


@pytest.mark.parametrize("changes", [
    {"async_scheduling": "off"}, {"spec_decode": "ngram"}, {"prefix_reuse": True},
    {"chunked_prefill": 64}, {"cudagraph_mode": "NONE"},
])
def test_engine_settings_the_baseline_runs_are_in_its_key(changes):
    assert SMOKE.replace(**changes).baseline_key != SMOKE.baseline_key


def test_the_decode_kv_layout_shares_the_baseline_but_not_the_pair():
    from harness.serve.deploy import pair_key

    nhd = SMOKE.replace(kv_layout="NHD")
    assert nhd.baseline_key == SMOKE.baseline_key
    assert pair_key(nhd) != pair_key(SMOKE) != pair_key(SMOKE.replace(kv_layout="HND"))


def test_engine_settings_round_trip_through_json():
    cell = SMOKE.replace(async_scheduling="on", spec_decode="ngram", prefix_reuse=True,
                         chunked_prefill=64, cudagraph_mode="PIECEWISE", kv_layout="NHD")
    back = Cell.from_dict(json.loads(json.dumps(cell.to_dict())))
    assert back == cell and back.cell_id == cell.cell_id
