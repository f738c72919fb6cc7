"""Exact NIXL byte accounting against numbers measured on real CPU and H200 pairs."""
from __future__ import annotations

import pytest

from harness.core.kv_geometry import GeometryUnknown, KvGeometry
from harness.judge.byte_accounting import account, attention_blocks

LLAMA = KvGeometry(attention_layers=4, kv_heads=2, head_dim=64, dtype_bytes=2)
GRANITE = KvGeometry(attention_layers=2, kv_heads=2, head_dim=64, dtype_bytes=2, state_layers=1)


def params(*groups: int) -> dict:
    return {"remote_block_ids": [list(range(n)) for n in groups]}


def test_dense_p128_request_of_four_blocks_reads_one_mebibyte():
    # measured: 50 requests, 200 blocks of 128 -> 52,428,800 NIXL bytes (CPU smoke, 2026-12-01)
    acc = account([params(4)] * 50, LLAMA, 128, 52_428_800)
    assert acc.exact and acc.expected == 52_428_800 and acc.attention_blocks == 200
    assert "exactly the expected 52,428,800 bytes" in acc.detail()


def test_a_short_transfer_is_named_with_both_numbers():
    # the fault the byte check was built for: the last block pair of each READ skipped, 75 % of the bytes
    acc = account([params(4)] * 50, LLAMA, 128, 39_321_600)
    assert not acc.exact
    assert acc.detail().endswith("short by 13,107,200 bytes (75.0 %)")
    assert "excess of" in account([params(4)], LLAMA, 128, 1_048_577).detail()


def test_heterogeneous_blocks_count_the_prefill_blocks():
    # P64 -> D128: 383 prefill blocks of 64 for 50 requests, 50,200,576 bytes (CPU, 2026-12-01)
    acc = account([params(8)] * 33 + [params(7)] * 17, LLAMA, 64, 50_200_576)
    assert acc.attention_blocks == 383 and acc.exact


def test_hybrid_adds_one_state_per_request_and_uses_the_attention_group():
    # Granite on CPU: groups [1 state block, 4, 4]; state (3264 + 32768) bytes as vLLM logged it;
    # 200 requests -> 112,064,000 bytes. On the H200 the state is bf16: (3264 + 16384).
    cpu = account([params(1, 4, 4)] * 200, GRANITE, 128, 112_064_000,
                  state_bytes_per_layer=3264 + 32768)
    assert cpu.exact and cpu.state_bytes == 200 * 36_032
    gpu = account([params(1, 4, 4)] * 100, GRANITE, 128, 54_393_600,
                  state_bytes_per_layer=3264 + 16384)
    assert gpu.exact


def test_requests_without_params_and_prefix_cache_hits_are_not_expected_to_be_read():
    acc = account([None, {}, params(4)], LLAMA, 128, 1_048_576 - 128 * 2048,
                  cache_hit_tokens=128)
    assert acc.requests == 1 and acc.cache_hit_bytes == 128 * 2048 and acc.exact
    assert attention_blocks({}) == 0 and attention_blocks(params(1, 3, 3)) == 3


SWA = KvGeometry(attention_layers=4, kv_heads=2, head_dim=64, dtype_bytes=2, sliding_layers=2)


def test_a_sliding_group_counts_only_its_real_blocks():
    # measured (CPU, tiny-llama-swa-gsm, window 64, 2026-12-02): a 485-token prompt's params
    # list [[0, 44], [45, 46, 47, 48]]: the sliding group keeps only the last block; 133 such
    # requests and 67 whose window reaches back into the third block gave NIXL's 139,853,824
    one_block = {"remote_block_ids": [[0, 44], [45, 46, 47, 48]]}
    two_blocks = {"remote_block_ids": [[43, 44], [45, 46, 47, 48]]}
    acc = account([one_block] * 133 + [two_blocks] * 67, SWA, 128, 139_853_824)
    assert acc.exact and acc.attention_blocks == 133 * 5 + 67 * 6
    counted_null = account([two_blocks] * 200, SWA, 128, 139_853_824)
    assert not counted_null.exact and counted_null.expected == 157_286_400
    # without the window the null id would be read as a block: the dense formula
    assert account([one_block], LLAMA, 128, 0).expected == 4 * 128 * LLAMA.attention_bytes_per_token


GEMMA = KvGeometry(attention_layers=34, kv_heads=4, head_dim=256, dtype_bytes=2, sliding_layers=29)


def test_a_padded_sliding_model_counts_every_slot_of_its_groups():
    # measured (H200 vLLM 0.26, shape-gemma-3-4b, 2026-12-03, results/reference/
    # gpu-h200-shapes-fp8-push-20261203): 50 requests of 4 blocks in each of 7 groups; NIXL moved
    # 3,670,016,000 = 1,400 x 128 x 5 slots x 4,096 B, where 34 layers give 3,565,158,400
    request = {"remote_block_ids": [[4 * g + i for i in range(1, 5)] for g in range(7)]}
    acc = account([request] * 50, GEMMA, 128, 3_670_016_000)
    assert acc.exact and acc.attention_blocks == 1400, acc.detail()
    assert 1400 * 128 * GEMMA.attention_bytes_per_token // 7 == 3_565_158_400   # the old count
    # the sliding groups' null ids are still not read
    short = {"remote_block_ids": [request["remote_block_ids"][0]] + [[0, 0, 0, 9]] * 6}
    assert account([short], GEMMA, 128, 0).expected == (4 + 6) * 128 * 5 * 4096


def test_params_of_other_groups_than_the_geometrys_are_not_counted():
    with pytest.raises(GeometryUnknown, match="list 2 KV cache groups, the geometry has 7"):
        account([{"remote_block_ids": [[1], [2]]}], GEMMA, 128, 0)
