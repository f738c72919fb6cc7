"""The KV digest over an fp8 cache: raw bits, so a flipped bit is seen."""
from __future__ import annotations

import pytest
import torch

from harness.serve.plugins.kv_digest.digest import hash_array
from harness.serve.plugins.kv_digest.layout import to_numpy


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_an_fp8_cache_is_hashed_over_its_raw_bits(dtype):
    cache = torch.randn(2, 2, 128, 64).to(dtype)
    bits = to_numpy(cache)
    assert bits.dtype.name == "uint8" and (bits == cache.view(torch.uint8).numpy()).all()
    flipped = cache.clone()
    flipped.view(torch.uint8)[1, 0, 5, 7] ^= 1
    assert hash_array(to_numpy(flipped)) != hash_array(bits)
    assert hash_array(to_numpy(cache.clone())) == hash_array(bits)
