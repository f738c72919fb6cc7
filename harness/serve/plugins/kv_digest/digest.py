"""Layout-independent digests of a request's prompt KV: do prefill and decode hold the same bytes?

The prefill server hashes each request's prompt KV after its forward pass; the decode server
hashes what it holds once its connector has finished receiving (after its host-buffer sync
and block-size / layout post-processing). Both first read one attention layer's blocks into the
canonical ``[2 (K, V), heads, tokens, head_dim]`` array (harness.serve.plugins.kv_digest.layout),
then hash it per (K/V, head, token range) over the raw little-endian bytes, so equal bits give
equal digests and any change, even -0.0 for 0.0, shows. Two hash functions
(``PD_ACCURACY_KV_DIGEST_HASH``): ``device`` (default) hashes with torch ops on the device the KV
lives on, every layer of a request in one pass, and copies only the 8-byte digests to the host
(harness.serve.plugins.kv_digest.device_hash); ``blake2b`` copies each layer's canonical KV to the
host and runs blake2b per entry. Token ranges are aligned to absolute prompt positions, so a
decode that received only the tail of a prompt (a local prefix-cache hit) lines up with the
prefill's whole-prompt digest. Pure: numpy at import time; vLLM is never imported. Comparing two
sides is the judge's (harness.judge.kv_digest_check.compare_digests).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from harness.protocol.kv_digest import HASH_FUNCTIONS, KVDigest, chunk_bounds, hash_choice
from harness.serve.plugins.kv_digest import device_hash
from harness.serve.plugins.kv_digest.layout import (KVLayout, canonical_kv, canonical_kv_tensor,
                                                    gather_rows, to_numpy)

DIGEST_BYTES = 8  # 64 bits per entry: a chance collision is ~2**-64 per compared entry
DEFAULT_TOKEN_CHUNK = 128


def digest(canonical: Any, token_chunk: int = DEFAULT_TOKEN_CHUNK, head_offset: int = 0,
           token_offset: int = 0, function: str | None = None) -> KVDigest:
    """Hash each ``[kv, head, token chunk]`` slice of a canonical ``[2, H, T, D]`` array;
    ``head_offset`` is the global index of its first head (a TP rank's first KV head),
    ``token_offset`` the prompt position of its first token; ``function``: ``blake2b`` or
    ``device`` (HASH_FUNCTIONS; default: PD_ACCURACY_KV_DIGEST_HASH's).
    """
    if token_chunk < 1:
        raise ValueError(f"token_chunk must be >= 1, got {token_chunk}")
    if (function or hash_choice()) != "blake2b":
        hasher = DeviceHasher()
        result = hasher.canonical(device_hash.as_tensor(canonical), token_chunk, head_offset,
                                  token_offset)
        hasher.start()
        hasher.wait()
        return result()
    array = _little_endian(to_numpy(canonical))
    if array.ndim != 4 or array.shape[0] != 2:
        raise ValueError(f"canonical KV is [2, heads, tokens, head_dim]; got {array.shape}")
    _, heads, tokens, _ = array.shape
    if token_offset < 0:
        raise ValueError(f"token_offset must be >= 0, got {token_offset}")
    spans = [(start - token_offset, end - token_offset)
             for start, end in chunk_bounds(token_offset, tokens, token_chunk)] if tokens else []
    hashes = tuple(tuple(tuple(hash_array(array[kv, head, a:b]) for a, b in spans)
                         for head in range(heads)) for kv in range(2))
    return KVDigest(head_offset, tokens, token_chunk, array.dtype.name, hashes, token_offset)


def digest_layer(cache: Any, block_ids: Sequence[int], num_tokens: int, layout: KVLayout, *,
                 token_chunk: int = DEFAULT_TOKEN_CHUNK, head_offset: int = 0,
                 token_offset: int = 0, function: str | None = None) -> KVDigest:
    """``digest(canonical_kv(...))`` for one layer: ``block_ids`` hold prompt positions
    ``token_offset .. token_offset + num_tokens - 1`` (the offset is a block boundary)."""
    function = function or hash_choice()
    if function != "blake2b":
        return digest(canonical_kv_tensor(cache, block_ids, num_tokens, layout), token_chunk,
                      head_offset, token_offset, function)
    return digest(canonical_kv(cache, block_ids, num_tokens, layout), token_chunk, head_offset,
                  token_offset, function)


def digest_state(state: Any, block_ids: Sequence[int] | None = None,
                 function: str | None = None) -> str:
    """Hash a hybrid model's conv / SSM state's bytes (C order, little-endian): with
    ``block_ids``, those rows of dim 0 (the state cache's block axis), in that order."""
    if (function or hash_choice()) != "blake2b":
        hasher = DeviceHasher()
        result = hasher.state([state], block_ids)
        hasher.start()
        hasher.wait()
        return result()
    if block_ids is None:
        array = to_numpy(state)
    else:
        array = gather_rows(state, np.asarray(block_ids, dtype=np.int64).reshape(-1), 0)
    return hash_array(_little_endian(array))


def hash_array(array: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(array).data, digest_size=DIGEST_BYTES).hexdigest()


def _little_endian(array: np.ndarray) -> np.ndarray:
    return array.astype(array.dtype.newbyteorder("<"), copy=False)


Result = Callable[[], Any]


class Blake2bHasher:
    """The host path: each entry hashed with blake2b as it is read (results ready at once)."""

    name = HASH_FUNCTIONS["blake2b"]
    device_s = 0.0

    def layer(self, cache: Any, block_ids: Sequence[int], num_tokens: int, layout: KVLayout,
              token_chunk: int, head_offset: int, token_offset: int) -> Result:
        value = digest_layer(cache, block_ids, num_tokens, layout, token_chunk=token_chunk,
                             head_offset=head_offset, token_offset=token_offset,
                             function="blake2b")
        return lambda: value

    def state(self, parts: Sequence[Any], block_ids: Sequence[int] | None) -> Result:
        value = "+".join(digest_state(part, block_ids, "blake2b") for part in parts)
        return lambda: value

    def raw(self, blocks: Any, pieces: int) -> Result:
        """``blocks``: the request's blocks, block axis first, in memory order."""
        data = np.ascontiguousarray(to_numpy(blocks)).reshape(blocks.shape[0], -1).view(np.uint8)
        value = [hash_array(piece) for piece in data.reshape(blocks.shape[0] * pieces, -1)]
        return lambda: value

    def start(self) -> None:
        pass

    def wait(self) -> None:
        pass


class DeviceHasher:
    """The device path (device_hash): a request's entries are gathered and hashed where the KV
    lives; :meth:`start` hashes every layer in one pass per shape and begins the one copy of
    the digests to the host, :meth:`wait` lets the results be read."""

    name = HASH_FUNCTIONS["device"]

    def __init__(self, device: Any = None) -> None:
        self.batch = device_hash.Batch(device)
        self._layers: list[tuple[Any, int, int, int]] = []
        self._digests: list[KVDigest] = []
        self._handles: dict[int, tuple[int, int]] = {}
        self._rows: list[Any] = []            # raw pieces: [pieces, bytes] uint8 per layer
        self._row_handles: list[tuple[int, int, int]] = []
        self._row_values: list[Any] = []

    @property
    def device_s(self) -> float:
        return self.batch.device_s

    @property
    def on_gpu(self) -> bool:
        """Whether the results wait on a GPU's copy (else they are ready after start)."""
        return self.batch.on_gpu

    def layer(self, cache: Any, block_ids: Sequence[int], num_tokens: int, layout: KVLayout,
              token_chunk: int, head_offset: int, token_offset: int) -> Result:
        return self.canonical(canonical_kv_tensor(cache, block_ids, num_tokens, layout),
                              token_chunk, head_offset, token_offset)

    def canonical(self, canonical: Any, token_chunk: int, head_offset: int, token_offset: int
                  ) -> Result:
        if canonical.dim() != 4 or canonical.shape[0] != 2:
            raise ValueError(f"canonical KV is [2, heads, tokens, head_dim]; got "
                             f"{tuple(canonical.shape)}")
        if token_offset < 0:
            raise ValueError(f"token_offset must be >= 0, got {token_offset}")
        slot = len(self._layers)
        self._layers.append((canonical, token_chunk, head_offset, token_offset))
        return lambda: self._digests[slot]

    def state(self, parts: Sequence[Any], block_ids: Sequence[int] | None) -> Result:
        handles = []
        for part in parts:
            tensor = device_hash.as_tensor(part)
            if block_ids is not None:
                tensor = tensor.index_select(0, device_hash.index_tensor(block_ids,
                                                                         tensor.device))
            handles.append(self.batch.add(device_hash.row_hashes(tensor.reshape(1, -1))))
        return lambda: "+".join(device_hash.hex_list(self.batch.values(h))[0] for h in handles)

    def raw(self, blocks: Any, pieces: int) -> Result:
        import torch

        tensor = device_hash.as_tensor(blocks)
        rows = tensor.contiguous().reshape(tensor.shape[0], -1).view(torch.uint8).reshape(
            tensor.shape[0] * pieces, -1)
        slot = len(self._rows)
        self._rows.append(rows)
        return lambda: device_hash.hex_list(self._row_values[slot])

    def start(self) -> None:
        """Hash every layer collected (layers of one shape stacked: one pass), then begin the
        host copy."""
        import torch

        groups: dict[tuple, list[int]] = {}
        for slot, (canonical, chunk, _, offset) in enumerate(self._layers):
            key = (tuple(canonical.shape), canonical.dtype, canonical.device, chunk, offset)
            groups.setdefault(key, []).append(slot)
        for (_, _, device, chunk, offset), slots in groups.items():
            if device.type == "cpu":     # no launches to save: skip the copy a stack makes
                for slot in slots:
                    handle = self.batch.add(device_hash.chunk_hashes(
                        self._layers[slot][0][None], offset, chunk))
                    self._handles[slot] = (handle, 0)
                continue
            stacked = torch.stack([self._layers[slot][0] for slot in slots])
            handle = self.batch.add(device_hash.chunk_hashes(stacked, offset, chunk))
            self._handles.update((slot, (handle, index)) for index, slot in enumerate(slots))
        # keep what the lines need, not the canonical copies (device memory until resolved)
        self._layers = [(_Shape(int(canonical.shape[2]), canonical.dtype), chunk, head, offset)
                        for canonical, chunk, head, offset in self._layers]
        by_width: dict[tuple, list[int]] = {}
        for slot, rows in enumerate(self._rows):   # on a CPU, per layer: no copy to a cat
            by_width.setdefault((rows.shape[1], rows.device,
                                 slot if rows.device.type == "cpu" else None), []).append(slot)
        self._row_handles = [(0, 0, 0)] * len(self._rows)
        for slots in by_width.values():   # every layer's pieces of one width: one pass
            handle = self.batch.add(device_hash.row_hashes(
                torch.cat([self._rows[slot] for slot in slots])))
            offset = 0
            for slot in slots:
                self._row_handles[slot] = (handle, offset, offset + self._rows[slot].shape[0])
                offset += self._rows[slot].shape[0]
        self._rows = []
        self.batch.start()

    def wait(self) -> None:
        self.batch.wait()
        self._digests = []
        for slot, (canonical, chunk, head_offset, offset) in enumerate(self._layers):
            if slot not in self._handles:       # start() did not get to it
                raise RuntimeError("the digest was not started")
            handle, index = self._handles[slot]
            values = self.batch.values(handle)[index]          # [2, H, C]
            flat = device_hash.hex_list(values)
            chunks, heads = values.shape[2], values.shape[1]
            hashes = tuple(tuple(tuple(flat[(kv * heads + head) * chunks:
                                            (kv * heads + head + 1) * chunks])
                                 for head in range(heads)) for kv in range(2))
            self._digests.append(KVDigest(head_offset, canonical.tokens, chunk,
                                          device_hash.dtype_name(canonical.dtype), hashes,
                                          offset))
        self._layers = []
        self._row_values = [self.batch.values(handle)[low:high]
                            for handle, low, high in self._row_handles]


@dataclass(frozen=True)
class _Shape:
    """What a resolved layer digest needs of its canonical KV once the hashes are taken."""

    tokens: int
    dtype: Any


def make_hasher(function: str, device: Any = None) -> Blake2bHasher | DeviceHasher:
    """The hasher for ``function`` (``device`` or ``blake2b``, HASH_FUNCTIONS)."""
    return Blake2bHasher() if function == "blake2b" else DeviceHasher(device)
