"""The KV digest's pure core: the same logical KV gives the same digests whatever the layout.

Caches are written here by independent writers (token t of a request lives in block
ids[t // block_size] at offset t % block_size, the rest of the cache is noise), then read back
through ``canonical_kv``; the canonical array must equal the logical KV exactly.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.serve.plugins.kv_digest.layout import KVLayout, canonical_kv, kernel_block_ids
from harness.judge.kv_digest_check import DigestMismatch, compare_digests
from harness.protocol.kv_digest import KVDigest, chunk_bounds, merge_heads, merge_tp_ranks
from harness.serve.plugins.kv_digest.digest import digest, digest_layer, digest_state

HEADS, HEAD_DIM, TOKENS, CHUNK = 4, 32, 200, 16


@pytest.fixture(autouse=True, params=["device", "blake2b"])
def hash_function(request, monkeypatch):
    """Every test here runs with both hashes (PD_ACCURACY_KV_DIGEST_HASH)."""
    monkeypatch.setenv("PD_ACCURACY_KV_DIGEST_HASH", request.param)
    return request.param
LAYERS = ("layer0", "layer1", "layer2")
NUM_CHUNKS = -(-TOKENS // CHUNK)


def logical_kv(seed: int, heads: int = HEADS) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, heads, TOKENS, HEAD_DIM)).astype(
        np.float32)


def noise(shape: tuple[int, ...], seed: int = 99) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def scattered_ids(num_blocks: int, needed: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(num_blocks)[:needed]


def slots(ids: np.ndarray, block_size: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    token = np.arange(tokens)
    return ids[token // block_size], token % block_size


# ------------------------------------------------------------------ writers, one per layout

def write_packed(kv, ids, block_size, num_blocks, heads_first):
    """[B, H, N, 2D] (heads_first) or memory-order NHD [B, N, H, 2D], K||V on the last dim."""
    _, heads, _, dim = kv.shape
    shape = (num_blocks, heads, block_size, 2 * dim) if heads_first else (
        num_blocks, block_size, heads, 2 * dim)
    cache = noise(shape)
    block, offset = slots(ids, block_size, kv.shape[2])
    per_token = np.concatenate([kv[0], kv[1]], axis=-1).transpose(1, 0, 2)  # [T, H, 2D]
    if heads_first:
        cache[block, :, offset] = per_token
    else:
        cache[block, offset] = per_token
    return cache


def cpu_page_positions(isa: str, block_size: int, dim: int):
    """Where (token t, dim d) sits in the K and the V half of a CPU_ATTN (block, head) page,
    as measured from vLLM 0.32's ops.cpu_attn_reshape_and_cache (see kv_digest.py)."""
    t, d = np.meshgrid(np.arange(block_size), np.arange(dim), indexing="ij")  # [N, D] each
    if isa == "vec":  # K dim-major [D, N], V token-major [N, D]
        return d * block_size + t, t * dim + d
    assert isa == "amx"  # K [N/16, D/2, 16, 2], V [D/16, N/2, 16, 2]
    key = (((t // 16) * (dim // 2) + d // 2) * 16 + t % 16) * 2 + d % 2
    value = (((d // 16) * (block_size // 2) + t // 2) * 16 + d % 16) * 2 + t % 2
    return key, value


def write_cpu(kv, ids, block_size, num_blocks, isa="vec"):
    """cpu_attn.py: [B, H, N, 2D] whose (block, head) page is the K half then the V half."""
    _, heads, tokens, dim = kv.shape
    cache = noise((num_blocks, heads, block_size, 2 * dim))
    pages = cache.reshape(num_blocks, heads, 2, block_size * dim)
    key_at, value_at = cpu_page_positions(isa, block_size, dim)
    block, offset = slots(ids, block_size, tokens)
    for token in range(tokens):
        pages[block[token], :, 0][:, key_at[offset[token]]] = kv[0, :, token]
        pages[block[token], :, 1][:, value_at[offset[token]]] = kv[1, :, token]
    return cache


def write_stacked_outer_nhd(kv, ids, block_size, num_blocks):
    _, heads, _, dim = kv.shape
    cache = noise((2, num_blocks, block_size, heads, dim))
    block, offset = slots(ids, block_size, kv.shape[2])
    cache[:, block, offset] = kv.transpose(0, 2, 1, 3)
    return cache


def write_stacked_inner_hnd(kv, ids, block_size, num_blocks):
    _, heads, _, dim = kv.shape
    cache = noise((num_blocks, 2, heads, block_size, dim))
    block, offset = slots(ids, block_size, kv.shape[2])
    cache[block, :, :, offset] = kv.transpose(2, 0, 1, 3)
    return cache


def write_separate_nhd(kv, ids, block_size, num_blocks):
    _, heads, _, dim = kv.shape
    key, value = noise((num_blocks, block_size, heads, dim), 1), noise(
        (num_blocks, block_size, heads, dim), 2)
    block, offset = slots(ids, block_size, kv.shape[2])
    key[block, offset] = kv[0].transpose(1, 0, 2)
    value[block, offset] = kv[1].transpose(1, 0, 2)
    return key, value


def nhd_memory_logical_view(kv, ids, block_size, num_blocks):
    """What vLLM 0.32 hands around under LBNHC: NHD memory seen as logical [B, H, N, 2D]."""
    return write_packed(kv, ids, block_size, num_blocks, heads_first=False).transpose(0, 2, 1, 3)


CASES = {
    # name: (writer, layout for a block size)
    "cpu_attn_vec": (write_cpu, KVLayout.cpu_attn),
    "cpu_attn_amx": (lambda *a: write_cpu(*a, isa="amx"),
                     lambda bs: KVLayout.cpu_attn(bs, isa="amx")),
    "flash_attn_logical_over_nhd": (nhd_memory_logical_view, KVLayout.flash_attn),
    "flashinfer_hnd": (lambda *a: write_packed(*a, heads_first=True), KVLayout.flashinfer),
    "memory_order_nhd": (lambda *a: write_packed(*a, heads_first=False),
                         lambda bs: KVLayout.memory_order("LBNHC", bs)),
    "stacked_outer_nhd": (write_stacked_outer_nhd, lambda bs: KVLayout("stacked_outer", False, bs)),
    "stacked_inner_hnd": (write_stacked_inner_hnd, lambda bs: KVLayout("stacked_inner", True, bs)),
    "separate_nhd": (write_separate_nhd, lambda bs: KVLayout("separate", False, bs)),
}


def build(case: str, kv: np.ndarray, block_size: int, seed: int):
    """A cache of ``case`` holding ``kv`` in scattered blocks, with its block ids and layout."""
    writer, layout_for = CASES[case]
    needed = -(-TOKENS // block_size)
    num_blocks = needed + 9
    ids = scattered_ids(num_blocks, needed, seed)
    return writer(kv, ids, block_size, num_blocks), ids, layout_for(block_size)


# ------------------------------------------------------------------ same bytes, same digests

@pytest.mark.parametrize("block_size", [16, 64, 128])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_layout_and_block_size_gives_the_logical_kv(case, block_size):
    kv = logical_kv(0)
    cache, ids, layout = build(case, kv, block_size, seed=block_size)
    canonical = canonical_kv(cache, ids, TOKENS, layout)
    assert canonical.shape == (2, HEADS, TOKENS, HEAD_DIM)
    np.testing.assert_array_equal(canonical, kv)
    assert digest(canonical, CHUNK) == digest(kv, CHUNK)


def test_logical_block_of_128_over_kernel_blocks_of_64():
    kv = logical_kv(1)
    manager_ids = np.array([5, 0, 3])  # 128-token blocks; 200 tokens need 2 of them
    kernel_ids = (manager_ids[:, None] * 2 + np.arange(2)).reshape(-1)
    cache = write_cpu(kv, kernel_ids, 64, num_blocks=12, isa="amx")
    by_manager = canonical_kv(cache, manager_ids, TOKENS, KVLayout.cpu_attn(64, 128, isa="amx"))
    by_kernel = canonical_kv(cache, kernel_ids, TOKENS, KVLayout.cpu_attn(64, isa="amx"))
    np.testing.assert_array_equal(by_manager, kv)
    np.testing.assert_array_equal(by_kernel, kv)
    assert list(kernel_block_ids([5, 0], 200, KVLayout.cpu_attn(64, 128))) == [10, 11, 0, 1]


def test_prefill_and_decode_agree_across_layouts_block_sizes_and_tp():
    """Prefill: CPU_ATTN, TP 1, block 16. Decode: NHD under LBNHC, TP 2, block 128 over 64."""
    prefill, decode_ranks = {}, [{}, {}]
    for index, layer in enumerate(LAYERS):
        kv = logical_kv(10 + index)
        cache, ids, layout = build("cpu_attn_vec", kv, 16, seed=index)
        prefill[layer] = digest_layer(cache, ids, TOKENS, layout, token_chunk=CHUNK)
        for rank, heads in enumerate((slice(0, 2), slice(2, 4))):
            manager_ids = scattered_ids(8, 2, seed=100 + index + rank)
            kernel_ids = (manager_ids[:, None] * 2 + np.arange(2)).reshape(-1)
            rank_cache = nhd_memory_logical_view(kv[:, heads], kernel_ids, 64, num_blocks=16)
            decode_ranks[rank][layer] = digest_layer(
                rank_cache, manager_ids, TOKENS, KVLayout.flash_attn(64, 128),
                token_chunk=CHUNK, head_offset=heads.start)
    merged = merge_tp_ranks(decode_ranks)
    assert merged == prefill
    assert compare_digests(prefill, merged) is None
    for rank in decode_ranks:
        assert compare_digests(prefill, rank, shared_heads_only=True) is None
    # one rank alone against all heads: the other rank's heads are missing, half the entries
    missing = compare_digests(prefill, decode_ranks[0])
    assert missing == DigestMismatch("layer0", "K", 2, (0, CHUNK), differing=3 * 2 * 2 * NUM_CHUNKS,
                                     total=3 * 2 * 4 * NUM_CHUNKS)
    assert missing.share == 0.5


# ------------------------------------------------------------------ changes found exactly

def model_caches(case: str, block_size: int, seed: int):
    return {layer: build(case, logical_kv(20 + i), block_size, seed + i)
            for i, layer in enumerate(LAYERS)}


def digests_of(built) -> dict[str, KVDigest]:
    return {layer: digest_layer(cache, ids, TOKENS, layout, token_chunk=CHUNK)
            for layer, (cache, ids, layout) in built.items()}


def test_one_element_change_is_found_at_its_layer_kv_head_and_token_range():
    prefill = digests_of(model_caches("cpu_attn_vec", 16, seed=0))
    decode = model_caches("memory_order_nhd", 64, seed=7)
    assert compare_digests(prefill, digests_of(decode)) is None

    cache, ids, _ = decode["layer1"]
    token, head = 137, 2
    cache[ids[token // 64], token % 64, head, HEAD_DIM + 5] += 1.0  # V, dim 5
    found = compare_digests(prefill, digests_of(decode))
    assert found == DigestMismatch("layer1", "V", head, (128, 144), differing=1,
                                   total=len(LAYERS) * 2 * HEADS * NUM_CHUNKS)

    cache, ids, _ = decode["layer2"]
    cache[ids[(TOKENS - 1) // 64], (TOKENS - 1) % 64, 0, 0] += 3.0  # K head 0, last token
    found = compare_digests(prefill, digests_of(decode))
    assert (found.layer, found.kv, found.head, found.token_range) == ("layer1", "V", 2, (128, 144))
    assert found.differing == 2
    assert compare_digests({"layer2": prefill["layer2"]}, {"layer2": digests_of(decode)["layer2"]}
                           ) == DigestMismatch("layer2", "K", 0, (192, TOKENS), 1, 2 * HEADS
                                               * NUM_CHUNKS)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_unused_tail_of_the_last_block_is_ignored(case):
    writer, layout_for = CASES[case]
    kv, needed = logical_kv(3), -(-TOKENS // 64)
    ids = scattered_ids(needed + 3, needed, seed=3)
    tail = noise((2, HEADS, needed * 64 - TOKENS, HEAD_DIM), seed=4)
    with_tail = writer(np.concatenate([kv, tail], axis=2), ids, 64, needed + 3)
    without = writer(kv, ids, 64, needed + 3)
    assert digest_layer(with_tail, ids, TOKENS, layout_for(64)) == digest_layer(
        without, ids, TOKENS, layout_for(64))


def test_only_the_prompt_tokens_count():
    built = model_caches("flashinfer_hnd", 64, seed=3)
    before = digests_of(built)
    cache, ids, _ = built["layer0"]
    last = ids[(TOKENS - 1) // 64]
    cache[last, :, TOKENS % 64:] = 12345.0  # the unused tail of the last block
    unused = sorted(set(range(cache.shape[0])) - set(ids.tolist()))
    cache[unused] = -1.0  # blocks of other requests
    assert digests_of(built) == before
    cache[last, 1, TOKENS % 64 - 1, 0] = 12345.0  # the last prompt token
    assert compare_digests(before, digests_of(built)).token_range == (192, TOKENS)


def test_signed_zero_and_dtype_are_bytes_not_values():
    kv = np.zeros((2, 1, 4, 2), dtype=np.float32)
    flipped = kv.copy()
    flipped[1, 0, 3, 1] = -0.0
    assert compare_digests({0: digest(kv, 2)}, {0: digest(flipped, 2)}) == DigestMismatch(
        0, "V", 0, (2, 4), 1, 4)
    big_endian = kv.astype(">f4")
    assert digest(big_endian, 2) == digest(kv, 2)
    assert compare_digests({0: digest(kv, 2)}, {0: digest(kv.astype(np.float16), 2)}).share == 1.0


def test_torch_bfloat16_caches_hash_their_bits():
    torch = pytest.importorskip("torch")
    kv = logical_kv(4)
    cpu_cache, cpu_ids, cpu_layout = build("cpu_attn_vec", kv, 16, seed=1)
    nhd_ids = scattered_ids(12, 4, seed=2)
    nhd = write_packed(kv, nhd_ids, 64, 12, heads_first=False)
    nhd_view = torch.from_numpy(nhd).to(torch.bfloat16).permute(0, 2, 1, 3)  # as vLLM views it
    cpu_tensor = torch.from_numpy(cpu_cache).to(torch.bfloat16)
    canonical = canonical_kv(cpu_tensor, cpu_ids, TOKENS, cpu_layout)
    bits = torch.from_numpy(kv).to(torch.bfloat16).view(torch.int16).numpy()
    np.testing.assert_array_equal(canonical, bits)
    decode = digest_layer(nhd_view, nhd_ids, TOKENS, KVLayout.flash_attn(64), token_chunk=CHUNK)
    assert digest(canonical, CHUNK) == decode
    nhd_view[nhd_ids[70 // 64], 3, 70 % 64, 2] = 0.5  # K head 3, token 70, dim 2
    changed = digest_layer(nhd_view, nhd_ids, TOKENS, KVLayout.flash_attn(64), token_chunk=CHUNK)
    found = compare_digests({"l": decode}, {"l": changed})
    assert (found.kv, found.head, found.token_range, found.differing) == ("K", 3, (64, 80), 1)


# ------------------------------------------------------------------ SSM state, plumbing

def test_state_digest_hashes_the_request_rows_bytes():
    states = noise((10, 6, 4), seed=5)  # [blocks, conv dim, state len]
    mine = digest_state(states, [7])
    assert mine == digest_state(states[7:8]) == digest_state(np.asfortranarray(states[7:8]))
    other = states.copy()
    other[2] += 1.0
    assert digest_state(other, [7]) == mine
    other[7, 5, 3] += 1.0
    assert digest_state(other, [7]) != mine
    kv_digest = digest(logical_kv(0), CHUNK)
    same = {"attn.0": kv_digest, "mamba.1": mine}
    assert compare_digests(same, dict(same)) is None
    assert compare_digests(same, {"attn.0": kv_digest, "mamba.1": digest_state(other, [7])}
                           ) == DigestMismatch("mamba.1", "state", None, None, 1,
                                               2 * HEADS * NUM_CHUNKS + 1)


def test_digest_round_trips_through_json_and_merges_heads_in_any_order():
    kv = logical_kv(6)
    full = digest(kv, CHUNK)
    assert KVDigest.from_dict(json.loads(json.dumps(full.to_dict()))) == full
    parts = [digest(kv[:, 3:], CHUNK, head_offset=3), digest(kv[:, :3], CHUNK)]
    assert merge_heads(parts) == full
    with pytest.raises(ValueError, match="missing or repeated"):
        merge_heads([parts[0], digest(kv[:, :2], CHUNK)])


def test_bad_layouts_and_short_block_lists_are_refused():
    with pytest.raises(ValueError, match="heads must come first"):
        KVLayout("head_pages", False, 16)
    with pytest.raises(ValueError, match="no known CPU_ATTN page order"):
        KVLayout.cpu_attn(32, isa="neon")
    with pytest.raises(ValueError, match="does not tile"):  # amx tiles 16 tokens, 16 dims
        canonical_kv(noise((2, 1, 8, 32)), [0], 8, KVLayout.cpu_attn(8, isa="amx"))
    with pytest.raises(ValueError, match="not a multiple"):
        KVLayout.flash_attn(64, ids_block_size=96)
    with pytest.raises(ValueError, match="no per-layer"):
        KVLayout.memory_order("LHBNC", 16)
    assert KVLayout.memory_order("HND", 16).heads_before_tokens
    cache, ids, layout = build("cpu_attn_vec", logical_kv(0), 16, seed=0)
    with pytest.raises(ValueError, match="need 13 blocks"):
        canonical_kv(cache, ids[:-1], TOKENS, layout)
    with pytest.raises(ValueError, match="the layout says 32"):
        canonical_kv(cache, ids, TOKENS, KVLayout.cpu_attn(32))


def test_module_imports_without_torch_or_vllm():
    code = ("import sys, harness.serve.plugins.kv_digest.digest, harness.serve.plugins.kv_digest.layout; "
            "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_the_digest_record_reads_without_numpy_torch_or_vllm():
    code = ("import sys, harness.protocol.kv_digest; "
            "print(sorted(m for m in ('numpy', 'torch', 'vllm') if m in sys.modules))")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_token_ranges_are_aligned_to_absolute_prompt_positions():
    assert chunk_bounds(0, 70, 32) == [(0, 32), (32, 64), (64, 70)]
    assert chunk_bounds(48, 40, 32) == [(48, 64), (64, 88)]
    kv = logical_kv(3)
    whole = digest(kv, 32)
    tail = digest(kv[:, :, 64:], 32, token_offset=64)
    assert tail.token_range(0) == (64, 96)
    assert {k: v for k, v in whole.entries().items() if k[2][0] >= 64} == tail.entries()
    assert compare_digests({"l": whole}, {"l": tail}, received_only=True) is None
    assert compare_digests({"l": whole}, {"l": tail}) is not None   # all positions: differ
    # a tail starting off a chunk boundary: its short first chunk is left out, the rest compared
    odd = digest(kv[:, :, 48:], 32, token_offset=48)
    assert compare_digests({"l": whole}, {"l": odd}, received_only=True) is None
    changed = kv.copy()
    changed[1, 2, 150, 0] += 1
    found = compare_digests({"l": whole}, {"l": digest(changed[:, :, 48:], 32, token_offset=48)},
                            received_only=True)
    assert (found.kv, found.head, found.token_range, found.differing) == ("V", 2, (128, 160), 1)
    assert KVDigest.from_dict(json.loads(json.dumps(tail.to_dict()))) == tail
