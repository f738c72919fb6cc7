"""The KV digest's hash on the device the KV lives on: torch ops only, so the same code runs on a
CUDA cache and on a CPU one, and only the 8-byte digests ever leave the device.

A byte string is read as little-endian 64-bit words ``w_i`` (zero-padded to a whole word) and
hashed as

    H = sum_i fmix64(w_i XOR key(i))  mod 2**64,   key(i) = fmix64(i XOR SEED)

``fmix64`` is MurmurHash3's 64-bit finalizer (a bijection with full avalanche), computed in
int64 with wrapping multiplies and masked (logical) right shifts; SGLang's relocation-invariant
KV digest mixes words the same way. ``i`` is the word's position: for canonical KV the absolute
word index in the (K/V, head) stream of prompt tokens, ``token * words_per_token + word``, so
the same token's bytes hash the same on both sides whatever the chunk's first token, and two
swapped tokens or words change the sum. A sum over a chunk is one reduction, order-free, so a
whole request (every layer, K/V, head, token chunk) is a few elementwise passes and one sum.

What it guarantees, and its odds (docs/judging.md): a change of one word always changes ``H``
(``fmix64`` is a bijection and the other terms are unchanged); any other change leaves ``H``
equal with probability about 2**-64 for unstructured data (the terms behave as independent
uniform 64-bit values).
"""
from __future__ import annotations

import functools
from typing import Any

_MASK64 = (1 << 64) - 1
SEED = 0x9E3779B97F4A7C15          # the golden ratio's 64 bits: keeps key(0) off fmix64(0) = 0
_C1 = 0xFF51AFD7ED558CCD
_C2 = 0xC4CEB9FE1A85EC53


def _signed(value: int) -> int:
    """A 64-bit constant as the int64 torch multiplies with (two's complement)."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def fmix64_(x: Any) -> Any:
    """MurmurHash3's fmix64 on an int64 tensor, in place (wrapping int64 arithmetic)."""
    import torch

    shifted = torch.empty_like(x)
    for multiplier in (_signed(_C1), _signed(_C2), None):
        # a logical x >> 33: the arithmetic shift with the sign bits cleared
        torch.bitwise_right_shift(x, 33, out=shifted)
        x.bitwise_xor_(shifted.bitwise_and_((1 << 31) - 1))
        if multiplier is not None:
            x.mul_(multiplier)
    return x


def as_words(tensor: Any) -> tuple[Any, int]:
    """``tensor``'s bytes along its last axis as int64 words ``[..., W]`` (last axis zero-padded
    to whole words), and the unpadded bytes per row: any dtype, bits kept (bfloat16, fp8,
    -0.0 vs 0.0 all differ)."""
    import torch

    data = tensor.contiguous()
    if data.dim() == 0:
        data = data.reshape(1)
    raw = data.view(torch.uint8)
    width = int(raw.shape[-1])
    pad = -width % 8
    if pad:
        raw = torch.nn.functional.pad(raw, (0, pad))
    elif raw.storage_offset() % 8:    # a view starting mid-word cannot be read as int64
        raw = raw.clone()
    return raw.view(torch.int64), width


@functools.lru_cache(maxsize=32)
def keys(start: int, count: int, device: Any, row_bytes: int) -> Any:
    """``key(i)`` for word positions ``start .. start + count - 1`` of rows of ``row_bytes``
    bytes: the row length is in the key, so zero padding never makes two lengths alike. Kept
    for the next layers and requests of the same length (read only: callers xor into a copy)."""
    import torch

    positions = torch.arange(start, start + count, dtype=torch.int64, device=device)
    positions += row_bytes << 40        # positions stay far below 2**40 (a 1 TiB stream)
    return fmix64_(positions ^ _signed(SEED))


CPU_TILE_WORDS = 1 << 16   # 512 KiB: the eleven passes of fmix64 stay in a core's L2 cache


def mixed_sum(words: Any, key: Any) -> Any:
    """``sum fmix64(words ^ key)`` over the last axis, ``key`` broadcast against the trailing
    axes of ``words``: int64 ``words.shape[:-1]``. On a CPU the leading slices go through in
    cache-sized tiles (one pass over memory, not eleven); a GPU takes them in one pass."""
    import torch

    if words.device.type != "cpu" or words.numel() <= CPU_TILE_WORDS:
        return fmix64_(words ^ key).sum(dim=-1)
    lead = words.shape[:words.dim() - key.dim()]
    flat = words.reshape(-1, *key.shape)
    step = max(1, CPU_TILE_WORDS // max(1, key.numel()))
    parts = [fmix64_(flat[start:start + step] ^ key).sum(dim=-1)
             for start in range(0, flat.shape[0], step)]
    return torch.cat(parts).reshape(*lead, *key.shape[:-1])


def chunk_hashes(canonical: Any, token_offset: int, token_chunk: int) -> Any:
    """Hashes of ``canonical[..., kv, head, tokens, dims]`` (leading axes: layers, say) per
    token chunk: int64 ``[..., 2, H, C]``, chunk boundaries on multiples of ``token_chunk`` in
    absolute prompt positions (the first chunk may be short), position keys absolute."""
    import torch

    words, width = as_words(canonical.reshape(*canonical.shape[:-2], canonical.shape[-2], -1))
    tokens, per_token = words.shape[-2], words.shape[-1]
    if tokens == 0:
        return words.new_zeros((*words.shape[:-2], 0))
    key = keys(token_offset * per_token, tokens * per_token, words.device, width).view(
        tokens, per_token)
    per_token_sum = mixed_sum(words, key)
    front = token_offset % token_chunk
    back = -(front + tokens) % token_chunk
    # zeros add nothing to a sum: pad the per-token sums out to whole aligned chunks
    padded = torch.nn.functional.pad(per_token_sum, (front, back))
    return padded.view(*padded.shape[:-1], -1, token_chunk).sum(dim=-1)


def row_hashes(rows: Any) -> Any:
    """Hash of each row's bytes of ``rows`` ``[N, ...]`` (keys by word index within the row):
    int64 ``[N]``; a row's hash depends on its bytes only, not on where it sits."""
    words, width = as_words(rows.reshape(rows.shape[0], -1))
    return mixed_sum(words, keys(0, words.shape[-1], words.device, width))


def to_hex(value: int) -> str:
    """One hash as the 16 hex digits a digest line holds (the width blake2b-64 writes)."""
    return f"{int(value) & _MASK64:016x}"


def hex_list(values: Any) -> list[str]:
    """:func:`to_hex` of every value of an int64 numpy array, in C order (one conversion)."""
    import numpy as np

    text = np.ascontiguousarray(values, dtype=np.int64).astype(">u8").tobytes().hex()
    return [text[start:start + 16] for start in range(0, len(text), 16)]


def index_tensor(ids: Any, device: Any) -> Any:
    """Block ids as a long tensor on ``device``. To a GPU through pinned memory, non-blocking:
    a plain host-to-device copy would wait for the stream, stalling the step per layer."""
    import numpy as np
    import torch

    host = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64).reshape(-1))
    if getattr(device, "type", "cpu") != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def as_tensor(array: Any) -> Any:
    """A torch tensor of ``array`` (a numpy array is wrapped, not copied, where it can be)."""
    import numpy as np
    import torch

    if hasattr(array, "detach"):
        return array.detach()
    data = np.ascontiguousarray(array)
    if data.dtype.byteorder == ">":
        data = data.astype(data.dtype.newbyteorder("<"))
    return torch.from_numpy(data)


@functools.lru_cache(maxsize=None)
def dtype_name(dtype: Any) -> str:
    """The dtype a digest line names: numpy's, or the same-width integer the blake2b path reads
    a dtype numpy lacks as (bfloat16 -> int16, fp8 -> uint8), so both paths name it alike."""
    import torch

    empty = torch.empty(0, dtype=dtype)
    try:
        return empty.numpy().dtype.name
    except TypeError:
        return {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}[empty.element_size()]


class Batch:
    """Hash jobs of one request on one or more devices, fetched to the host in one copy per
    device: :meth:`add` returns a handle, :meth:`start` begins the copies (non-blocking from a
    CUDA device, after an event on the current stream), :meth:`values` waits and reads one."""

    def __init__(self, device: Any = None) -> None:
        self._jobs: list[Any] = []
        self._host: dict[int, Any] = {}
        self._events: list[Any] = []
        self._start: Any = None
        self._layout: list[tuple[Any, list[int]]] = []
        self._shapes: list[tuple[int, ...]] = []
        self.device_s = 0.0
        if getattr(device, "type", None) == "cuda":
            import torch

            # on the step's stream, before the first gather: the hash's GPU time starts here
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()

    def add(self, hashes: Any) -> int:
        self._jobs.append(hashes)
        return len(self._jobs) - 1

    def start(self) -> None:
        """Begin the host copies: the step goes on while they run."""
        import torch

        by_device: dict[Any, list[int]] = {}
        for handle, job in enumerate(self._jobs):
            by_device.setdefault(job.device, []).append(handle)
        for device, handles in by_device.items():
            flat = torch.cat([self._jobs[h].reshape(-1) for h in handles])
            if device.type == "cuda":
                host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
                host.copy_(flat, non_blocking=True)
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                self._events.append(end)
            else:
                host = flat
            self._layout.append((host, handles))
        self._shapes = [tuple(job.shape) for job in self._jobs]
        self._jobs = []           # the device tensors may go: the copies hold what they need

    @property
    def on_gpu(self) -> bool:
        return bool(self._events)

    def wait(self) -> None:
        """Block until every copy landed; ``device_s`` then holds the GPU time the hash took
        (first hash kernel to last copy, on the step's stream)."""
        for event in self._events:
            event.synchronize()
        if self._events and self._start is not None:
            self.device_s = self._start.elapsed_time(self._events[-1]) / 1000.0
        for host, handles in self._layout:
            values = host.numpy()
            offset = 0
            for handle in handles:
                size = 1
                for n in self._shapes[handle]:
                    size *= n
                self._host[handle] = values[offset:offset + size].reshape(self._shapes[handle])
                offset += size

    def values(self, handle: int) -> Any:
        """The int64 hashes of job ``handle`` as a numpy array (after :meth:`wait`)."""
        return self._host[handle]
