"""Where a request's prompt KV lives in one attention layer's paged cache, and how to read it
out in a CANONICAL order that does not depend on the layout:

    canonical[kv, head, token, dim]   shape [2 (K, V), num_kv_heads, num_tokens, head_dim]

holding the request's prompt tokens only (never the unused tail of the last block). The two
sides of a P/D transfer may differ in physical layout, block size, block ids and TP head split;
both read their cache through a KVLayout, so equal KV gives equal canonical arrays
(harness.serve.plugins.kv_digest.digest hashes them). Pure: numpy at import time; a torch cache is
gathered with torch (on its device, only the request's blocks): :func:`canonical_kv_tensor`
leaves the result there for the device hash, :func:`canonical_kv` reads it to numpy as
same-width raw bits where numpy lacks the dtype (bfloat16 -> int16, fp8 -> uint8) for blake2b.
Both run the same gathering steps. vLLM is never imported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

import numpy as np

KVSplit = Literal["content", "head_pages", "stacked_outer", "stacked_inner", "separate", "latent"]
KV_SPLITS = ("content", "head_pages", "stacked_outer", "stacked_inner", "separate", "latent")


# vLLM KVCacheLayout names (vllm/v1/kv_cache_layout.py) whose per-layer memory order keeps the
# block axis first: name -> heads before tokens. NHD/HND are vLLM's legacy aliases.
_MEMORY_ORDER_HEADS_FIRST = {"LBHNC": True, "BLHNC": True, "HND": True,
                             "LBNHC": False, "BLNHC": False, "NHD": False}


@dataclass(frozen=True)
class PageOrder:
    """Element order of one ``[N, D]`` half (K or V) of a CPU_ATTN (block, head) page: the
    ``[N, D]`` values split as ``[N / token_tile, token_tile, D / dim_tile, dim_tile]``, stored
    with those four axes in ``axes`` order."""

    token_tile: int = 1
    dim_tile: int = 1
    axes: tuple[int, int, int, int] = (0, 1, 2, 3)


TOKEN_MAJOR = PageOrder()
DIM_MAJOR = PageOrder(axes=(2, 3, 0, 1))
# Measured by writing coded K/V through vLLM 0.32's ops.cpu_attn_reshape_and_cache (the kernel
# behind CPU_ATTN's do_kv_cache_update): "vec" / "vec16" (fp32, fp16, bf16, fp8 caches) keep K
# dim-major and V token-major; "amx" (bf16 and fp8 caches; _get_attn_isa picks it for bf16
# only) packs K as [N/16, D/2, 16, 2], V as [D/16, N/2, 16, 2]. The isa is the layer's ``isa``.
CPU_ATTN_PAGE_ORDERS = {
    "vec": (DIM_MAJOR, TOKEN_MAJOR),
    "vec16": (DIM_MAJOR, TOKEN_MAJOR),
    "amx": (PageOrder(16, 2, (0, 2, 1, 3)), PageOrder(2, 16, (2, 0, 3, 1))),
}


@dataclass(frozen=True)
class KVLayout:
    """How one attention layer's paged cache tensor is laid out, as the tensor's axes read.

    ``kv_split`` says where K and V are (X, Y = H, N when ``heads_before_tokens`` else N, H):

    * ``"content"``: ``[B, X, Y, 2*D]``, K = ``[..., :D]``, V = ``[..., D:]`` (vLLM 0.32 packed).
    * ``"head_pages"``: ``[B, H, N, 2*D]`` whose ``2*N*D`` elements per (block, head) are the
      K half then the V half, each in ``k_page`` / ``v_page`` order (vLLM 0.32 CPU_ATTN).
    * ``"stacked_outer"``: ``[2, B, X, Y, D]``; ``"stacked_inner"``: ``[B, 2, X, Y, D]`` (the
      pre-0.32 FLASH_ATTN / FLASHINFER shapes in memory order).
    * ``"separate"``: the cache is a ``(K, V)`` pair, each ``[B, X, Y, D]``.
    * ``"latent"``: ``[B, N, L]``, one MLA latent vector per token (vLLM 0.26's CUDA MLA
      backends); canonically one "head" whose K slot holds the latent's first half and whose V
      slot its second, so every byte is digested.

    ``block_size`` is tokens per block of the tensor (the kernel block). ``ids_block_size`` is
    tokens per block id passed in (the scheduler's manager block, a multiple of ``block_size``;
    None = the same): manager block ``m`` is kernel blocks ``m * r .. m * r + r - 1``, ``r`` the
    ratio, as vLLM's connectors expand them.
    """

    kv_split: KVSplit
    heads_before_tokens: bool
    block_size: int
    ids_block_size: int | None = None
    k_page: PageOrder = TOKEN_MAJOR
    v_page: PageOrder = TOKEN_MAJOR

    def __post_init__(self) -> None:
        if self.kv_split not in KV_SPLITS:
            raise ValueError(f"kv_split must be one of {KV_SPLITS}, got {self.kv_split!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.ids_block_size is not None and (
            self.ids_block_size < self.block_size or self.ids_block_size % self.block_size
        ):
            raise ValueError(f"ids_block_size {self.ids_block_size} is not a multiple of "
                             f"block_size {self.block_size}")
        if self.kv_split == "head_pages" and not self.heads_before_tokens:
            raise ValueError("head_pages are per (block, head): heads must come first")

    @property
    def blocks_per_id(self) -> int:
        return (self.ids_block_size or self.block_size) // self.block_size

    @classmethod
    def flash_attn(cls, block_size: int, ids_block_size: int | None = None) -> "KVLayout":
        """FLASH_ATTN's per-layer cache in vLLM 0.32: the logical ``[B, H, N, 2*D]`` view that
        ``allocate_kv_cache`` (v1/worker/utils.py) builds and a connector's ``register_kv_caches``
        receives; ``FlashAttentionImpl.forward`` splits it as
        ``kv_cache.transpose(1, 2).split(head_size, dim=-1)`` (v1/attention/backends/flash_attn.py).
        Memory order is VLLM_KV_CACHE_LAYOUT (default LBNHC = NHD), hidden by the view's strides.
        FLASHINFER reads the same view (``kv_cache_permute.split(hs, dim=-1)``, flashinfer.py),
        with HND memory (LBHNC / BLHNC) on SM100 per its ``supported_kv_cache_layouts``.
        """
        return cls("content", True, block_size, ids_block_size)

    flashinfer = flash_attn

    @classmethod
    def cpu_attn(cls, block_size: int, ids_block_size: int | None = None, isa: str = "vec"
                 ) -> "KVLayout":
        """CPU_ATTN in vLLM 0.32 (v1/attention/backends/cpu_attn.py, ``do_kv_cache_update``):
        ``[B, H, N, 2*D]`` viewed as ``[B, H, 2*N, D]`` and ``chunk(2, dim=2)`` into the K and
        V halves of each (block, head) page, whose element order depends on ``isa``
        (``_get_attn_isa``: "amx" for bf16 on AMX CPUs, else "vec" / "vec16" on x86)."""
        if isa not in CPU_ATTN_PAGE_ORDERS:
            raise ValueError(f"no known CPU_ATTN page order for isa {isa!r}; known: "
                             f"{sorted(CPU_ATTN_PAGE_ORDERS)}")
        k_page, v_page = CPU_ATTN_PAGE_ORDERS[isa]
        return cls("head_pages", True, block_size, ids_block_size, k_page, v_page)

    @classmethod
    def memory_order(
        cls, kv_cache_layout: str, block_size: int, ids_block_size: int | None = None
    ) -> "KVLayout":
        """A packed cache reshaped in its memory order, e.g. a connector's host transfer buffer,
        allocated as ``(B, N, H, 2*D)`` under LBNHC before being viewed as logical
        ``(B, H, N, 2*D)`` (``initialize_host_xfer_buffer``). ``kv_cache_layout``
        is a vLLM KVCacheLayout name with the block axis outermost within a layer."""
        name = kv_cache_layout.upper()
        if name not in _MEMORY_ORDER_HEADS_FIRST:
            raise ValueError(f"no per-layer [B, ...] memory order for KV cache layout "
                             f"{kv_cache_layout!r}; pass the logical view with flash_attn()")
        return cls("content", _MEMORY_ORDER_HEADS_FIRST[name], block_size, ids_block_size)


def kernel_block_ids(block_ids: Sequence[int], num_tokens: int, layout: KVLayout) -> np.ndarray:
    """The kernel block ids holding the first ``num_tokens`` tokens, in token order."""
    ids = np.asarray(block_ids, dtype=np.int64).reshape(-1)
    ratio = layout.blocks_per_id
    if ratio > 1:
        ids = (ids[:, None] * ratio + np.arange(ratio, dtype=np.int64)).reshape(-1)
    needed = -(-num_tokens // layout.block_size)
    if num_tokens < 0 or needed > ids.size:
        raise ValueError(f"{num_tokens} tokens need {needed} blocks of {layout.block_size} "
                         f"tokens; the block ids give {ids.size}")
    return ids[:needed]


def canonical_kv(cache: Any, block_ids: Sequence[int], num_tokens: int, layout: KVLayout
                 ) -> np.ndarray:
    """One attention layer's prompt KV as ``[2 (K, V), num_kv_heads, num_tokens, head_dim]``.

    ``cache`` is the layer's numpy array or torch tensor (a ``(K, V)`` pair for ``"separate"``)
    read through ``layout``; ``block_ids`` are the request's blocks in token order, in units of
    ``layout.ids_block_size``. Heads are those the tensor holds (a TP rank's share). The result
    is a fresh C-contiguous numpy array; bfloat16 / fp8 come back as their raw bits.
    """
    return _canonical(cache, kernel_block_ids(block_ids, num_tokens, layout), num_tokens,
                      layout, _NUMPY)


def canonical_kv_tensor(cache: Any, block_ids: Sequence[int], num_tokens: int, layout: KVLayout
                        ) -> Any:
    """:func:`canonical_kv` as a contiguous torch tensor on the cache's own device, in the
    cache's dtype: nothing leaves the device (the device hash reads it there)."""
    return _canonical(cache, kernel_block_ids(block_ids, num_tokens, layout), num_tokens,
                      layout, _TORCH)


class _NumpyOps:
    """The array operations canonical gathering needs, on numpy (blocks read to the host)."""

    take = staticmethod(lambda cache, ids, axis: gather_rows(cache, ids, axis))
    stack = staticmethod(np.stack)
    permute = staticmethod(lambda array, axes: array.transpose(*axes))
    contiguous = staticmethod(np.ascontiguousarray)


class _TorchOps:
    """The same on torch tensors, on their device (a numpy cache is wrapped first)."""

    @staticmethod
    def take(cache: Any, ids: np.ndarray, axis: int) -> Any:
        from harness.serve.plugins.kv_digest.device_hash import as_tensor, index_tensor

        tensor = as_tensor(cache)
        return tensor.index_select(axis, index_tensor(ids, tensor.device))

    @staticmethod
    def stack(parts: Sequence[Any]) -> Any:
        import torch

        return torch.stack(list(parts))

    permute = staticmethod(lambda tensor, axes: tensor.permute(*axes))
    contiguous = staticmethod(lambda tensor: tensor.contiguous())


_NUMPY, _TORCH = _NumpyOps(), _TorchOps()


def _canonical(cache: Any, ids: np.ndarray, num_tokens: int, layout: KVLayout, ops: Any) -> Any:
    split = layout.kv_split
    if split == "separate":
        key, value = cache
        blocks = ops.stack([ops.take(key, ids, 0), ops.take(value, ids, 0)])
    elif split == "stacked_outer":
        blocks = ops.take(cache, ids, 1)
    elif split == "stacked_inner":
        blocks = ops.take(cache, ids, 0).swapaxes(0, 1)
    elif split == "latent":
        latent = ops.take(cache, ids, 0)
        if latent.ndim != 3 or latent.shape[-1] % 2:
            raise ValueError(f"a latent cache is [B, N, L], L even; got blocks "
                             f"{tuple(latent.shape)}")
        half = latent.shape[-1] // 2
        blocks = ops.stack([latent[:, None, :, :half], latent[:, None, :, half:]])
    else:
        packed = ops.take(cache, ids, 0)
        if packed.ndim != 4 or packed.shape[-1] % 2:
            raise ValueError(f"a packed cache is [B, X, Y, 2*D]; got blocks "
                             f"{tuple(packed.shape)}")
        head_dim = packed.shape[-1] // 2
        if split == "content":
            blocks = ops.stack([packed[..., :head_dim], packed[..., head_dim:]])
        else:
            n, heads, tokens, _ = packed.shape
            pages = ops.contiguous(packed).reshape(n, heads, 2, tokens * head_dim)
            blocks = ops.stack([_unpage(pages[:, :, kv], order, tokens, head_dim, ops)
                                for kv, order in enumerate((layout.k_page, layout.v_page))])
    if not layout.heads_before_tokens:
        blocks = blocks.swapaxes(2, 3)
    _, n, heads, tokens, head_dim = blocks.shape
    if tokens != layout.block_size:
        raise ValueError(f"cache blocks hold {tokens} tokens, the layout says {layout.block_size}")
    by_token = ops.permute(blocks, (0, 2, 1, 3, 4)).reshape(2, heads, n * tokens, head_dim)
    return ops.contiguous(by_token[:, :, :num_tokens])


def _unpage(pages: Any, order: PageOrder, tokens: int, head_dim: int, ops: Any = None) -> Any:
    """``[..., tokens * head_dim]`` page halves in ``order`` -> ``[..., tokens, head_dim]``."""
    if tokens % order.token_tile or head_dim % order.dim_tile:
        raise ValueError(f"{order} does not tile {tokens} tokens x {head_dim} dims")
    tiled = (tokens // order.token_tile, order.token_tile, head_dim // order.dim_tile,
             order.dim_tile)
    lead = pages.ndim - 1
    stored = pages.reshape(*pages.shape[:-1], *(tiled[axis] for axis in order.axes))
    inverse = [lead + int(axis) for axis in np.argsort(order.axes)]
    return (ops or _NUMPY).permute(stored, (*range(lead), *inverse)).reshape(
        *pages.shape[:-1], tokens, head_dim)


def gather_rows(cache: Any, ids: np.ndarray, axis: int) -> np.ndarray:
    """Rows ``ids`` of ``cache`` along ``axis``: only those blocks leave a torch device."""
    if not hasattr(cache, "index_select"):
        return np.take(np.asarray(cache), ids, axis=axis)
    import torch

    index = torch.as_tensor(ids, dtype=torch.long, device=cache.device)
    return to_numpy(cache.detach().index_select(axis, index))


def to_numpy(array: Any) -> np.ndarray:
    """A numpy array of ``array``'s values, or of its raw bits where numpy lacks the dtype."""
    if not hasattr(array, "detach"):
        return np.asarray(array)
    import torch

    tensor = array.detach().cpu().contiguous()
    try:
        return tensor.numpy()
    except TypeError:  # bfloat16, float8_*: same-width integers keep the exact bits
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        return tensor.view(bits[tensor.element_size()]).numpy()


def layout_from_shape(shape: Sequence[int], backend: str, kernel_block_size: int,
                      logical_block_size: int | None = None, isa: str = "vec") -> KVLayout:
    """The KVLayout of a per-layer cache tensor of ``shape`` as a connector's worker holds it.

    Which axis is the block's tokens is read off the shape: the one equal to the kernel (or
    logical) block size, the other of the two inner axes being the KV heads. ``[B, X, Y, 2D]``
    is packed (CPU_ATTN: head pages, ``isa`` picking their element order); ``[2, B, X, Y, D]`` /
    ``[B, 2, X, Y, D]`` are K/V stacked outside / inside the block axis (vLLM 0.26). Block ids
    are given in ``logical_block_size`` units (the scheduler's), expanded to the tensor's.
    """
    shape = tuple(int(n) for n in shape)
    sizes = {kernel_block_size, logical_block_size or kernel_block_size}
    if len(shape) == 3:   # MLA on CUDA: [B, N, latent]
        if shape[1] not in sizes:
            raise ValueError(f"latent cache {list(shape)}: axis 1 is not a block size "
                             f"{sorted(sizes)}")
        ids = logical_block_size if logical_block_size and logical_block_size != shape[1] else None
        return KVLayout("latent", True, shape[1], ids)
    if len(shape) == 4:
        split, inner = "content", shape[1:3]
    elif len(shape) == 5 and shape[0] == 2:
        split, inner = "stacked_outer", shape[2:4]
    elif len(shape) == 5 and shape[1] == 2:
        split, inner = "stacked_inner", shape[2:4]
    else:
        raise ValueError(f"no known paged KV layout has shape {list(shape)}")
    first, second = (n in sizes for n in inner)
    if first == second:
        raise ValueError(f"cannot tell tokens from heads in shape {list(shape)} "
                         f"(block sizes {sorted(sizes)})")
    heads_first = second
    tokens = inner[1] if heads_first else inner[0]
    ids = logical_block_size if logical_block_size and logical_block_size != tokens else None
    if backend.upper().startswith("CPU_ATTN") and split == "content" and heads_first:
        return KVLayout.cpu_attn(tokens, ids, isa)
    return KVLayout(split, heads_first, tokens, ids)  # type: ignore[arg-type]
