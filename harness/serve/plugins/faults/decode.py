"""vLLM general plugin: canary faults injected into the *decode* server's received KV cache.

The harness must prove it can see broken KV transfer, so a decode server started with
``PD_ACCURACY_FAULT`` corrupts each request's KV right after NIXL has finished receiving it and
before the first decode step attends to it. Which fault, which block, and the log lines that
report it are in :mod:`harness.serve.plugins.faults.spec`; this module does the corrupting.

Where it hooks (vLLM 0.32, ``kv_connector/v1/nixl/base_worker.py``):
``NixlBaseConnectorWorker.get_transfer_results`` pops ``_recving_metadata`` for every request
whose NIXL reads completed, after any host-buffer sync and block-size/layout post-processing.
The wrapper snapshots that dict, calls the original, then corrupts the requests reported in
``finished_recving`` but not in ``failed_recving``. The scheduler only makes those requests
runnable after it sees this result, so the corruption always precedes their first decode step.
Block ids are ``ReqMeta.local_physical_block_ids`` (kernel block ids, what dim 0 of the cache
tensors indexes); SSM/Mamba layers are never touched.
"""
from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from harness.serve.plugins.faults import fail_transfer
from harness.serve.plugins.faults.spec import (
    ARMED_PREFIX,
    BY_REQUEST,
    DEFAULT_PERTURB_SCALE,
    KV_FAULT_KINDS,
    SETUP_PREFIX,
    SKIPPED_PREFIX,
    FaultOutcome,
    FaultSpec,
    format_fault_line,
    parse_fault_env,
    parse_request_fault,
    perturb_scale,
    select_block_positions,
)

if TYPE_CHECKING:
    import torch

# Child of vLLM's "vllm" logger so the lines land in the decode server's log in vLLM's format.
logger = logging.getLogger("vllm.pd_accuracy.faults")

# Where the NIXL connector's worker lives, newest layout first: (module, class). vLLM 0.32 has
# NixlBaseConnectorWorker.get_transfer_results; older releases a NixlConnectorWorker whose
# get_finished() returns (done_sending, done_recving). Only the 0.32 target is tested for real.
WORKER_TARGETS = (
    ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker", "NixlBaseConnectorWorker"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker", "NixlConnectorWorker"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector", "NixlConnectorWorker"),
)
WORKER_MODULE, WORKER_CLASS = WORKER_TARGETS[0]
_PATCH_MARK = "__pd_accuracy_fault__"
# Noise is reproducible run to run: a canary that changes between runs would be noise itself.
NOISE_SEED = 0
try:
    PERTURB_SCALE = perturb_scale(os.environ)
except ValueError:  # reported by parse-time validation in the harness; never raise in vLLM
    PERTURB_SCALE = DEFAULT_PERTURB_SCALE

_registered = False


def block_dim(cache: "torch.Tensor", num_blocks: int | None) -> int:
    """Which dim of a per-layer cache is the block id.

    vLLM 0.32 hands the connector logical [B, H, N, C] views (K and V share a block; any
    physical stride order), so it is dim 0. Older vLLM (e.g. 0.26 FLASH_ATTN) used
    [2, B, N, H, D] with K/V first: recognised by a leading 2 followed by ``num_blocks``.
    """
    if (
        num_blocks and cache.ndim >= 3 and cache.shape[0] == 2
        and cache.shape[1] == num_blocks and num_blocks != 2
    ):
        return 1
    return 0


def blocks_view(
    cache: "torch.Tensor",
    page_bytes: int | None,
    dtype: "torch.dtype | None",
    num_blocks: int | None = None,
):
    """A view of ``cache`` whose dim 0 is the kernel block id (writes go to ``cache``).

    Caches that HMA shares between layer types arrive as flat byte tensors (``ndim == 1``, see
    ``register_kv_caches``); those are re-viewed as ``[num_blocks, page_bytes]`` and, when the
    layer's dtype is known, as that dtype so noise has meaningful values.
    """
    import torch

    if cache.ndim > 1:
        dim = block_dim(cache, num_blocks)
        return cache if dim == 0 else cache.movedim(dim, 0)
    if not page_bytes:
        raise ValueError("flat KV cache without a known page size")
    flat_bytes = cache.view(torch.uint8)
    if flat_bytes.numel() < page_bytes:
        raise ValueError("flat KV cache smaller than one page")
    pages = flat_bytes[: flat_bytes.numel() // page_bytes * page_bytes].view(-1, page_bytes)
    if dtype is not None and page_bytes % torch.empty((), dtype=dtype).element_size() == 0:
        return pages.view(dtype)
    return pages


def corrupt_block(
    blocks: "torch.Tensor", block_id: int, value: str, generator: "torch.Generator | None" = None
) -> None:
    """Overwrite block ``block_id`` of ``blocks`` (dim 0 = block) with zeros or noise."""
    import torch

    block = blocks[block_id]
    if value == "zero":
        block.zero_()
        return
    # Noise at the block's own scale, drawn in float32 on the CPU (randn does not cover every
    # KV dtype/device, e.g. fp8) and cast back.
    current = block.float()
    scale = float(current.std()) if current.numel() > 1 else 1.0
    if not scale or scale != scale:  # all-zero or NaN block: unit noise still breaks it
        scale = 1.0
    noise = torch.randn(tuple(block.shape), generator=generator, dtype=torch.float32) * scale
    block.copy_(noise.to(device=block.device, dtype=block.dtype))


def perturb_block(blocks: "torch.Tensor", block_id: int, scale: float,
                  generator: "torch.Generator | None" = None) -> None:
    """Multiply block ``block_id`` of ``blocks`` by ``1 + scale * N(0, 1)``, value by value."""
    import torch

    block = blocks[block_id]
    noise = torch.randn(tuple(block.shape), generator=generator, dtype=torch.float32)
    scaled = block.float() * (1.0 + scale * noise.to(block.device))
    block.copy_(scaled.to(dtype=block.dtype))


def swap_blocks(blocks: "torch.Tensor", block_a: int, block_b: int) -> None:
    """Exchange the contents of blocks ``block_a`` and ``block_b`` (dim 0 = block)."""
    saved = blocks[block_a].clone()
    blocks[block_a].copy_(blocks[block_b])
    blocks[block_b].copy_(saved)


def _is_spec_named(spec_or_type: Any, class_name: str) -> bool:
    # By class name along the MRO: keeps this module importable without vLLM and tolerant of
    # the spec classes moving between vLLM modules.
    spec_type = spec_or_type if isinstance(spec_or_type, type) else type(spec_or_type)
    return any(klass.__name__ == class_name for klass in spec_type.__mro__)


def is_attention_spec(spec_or_type: Any) -> bool:
    """True for attention KV specs (full, sliding, MLA...), False for Mamba/SSM and others."""
    return _is_spec_named(spec_or_type, "AttentionSpec") and not _is_spec_named(
        spec_or_type, "MambaSpec"
    )


def _is_attention_layer(spec: Any) -> bool:
    return spec is None or is_attention_spec(spec)


def _request_block_ids(meta: Any) -> list[list[int]]:
    """Kernel block ids per transfer group (older vLLM: one flat list for the only group)."""
    block_ids = getattr(meta, "local_physical_block_ids", None)
    if not block_ids:
        block_ids = getattr(meta, "local_block_ids", None) or []
    block_ids = list(block_ids)
    if block_ids and not isinstance(block_ids[0], (list, tuple)):
        return [[int(b) for b in block_ids]]
    return [list(group) for group in block_ids]


@dataclass(frozen=True)
class _AllLayersGroup:
    layer_names: list[str]
    kv_cache_spec: Any = None


def _transfer_groups(worker: Any) -> Sequence[Any]:
    config = getattr(worker, "kv_cache_config", None)
    groups = getattr(config, "transfer_groups", None)
    if groups is None and config is not None:
        groups = getattr(config, "kv_cache_groups", None)
    if groups is None:
        # Pre-HMA connector: no groups; every registered cache is an attention layer's.
        groups = [_AllLayersGroup(list(worker.device_kv_caches))]
    return groups


def apply_fault(worker: Any, meta: Any, spec: FaultSpec, generator: Any = None) -> FaultOutcome:
    """Apply ``spec`` to one received request on a vLLM NIXL connector worker.

    Uses ``worker.kv_cache_config.transfer_groups`` (layer names per transfer group),
    ``worker._layer_specs`` (per-layer KV spec), ``worker.device_kv_caches`` and
    ``worker._physical_blocks_per_logical_kv_block``; ``meta`` is the request's ``ReqMeta``.
    Only attention layers are touched; a storage aliased by several layers is touched once.
    """
    groups = _transfer_groups(worker)
    layer_specs: Mapping[str, Any] = getattr(worker, "_layer_specs", {}) or {}
    caches: Mapping[str, Any] = worker.device_kv_caches
    physical_per_logical = int(getattr(worker, "_physical_blocks_per_logical_kv_block", 1) or 1)
    num_blocks = getattr(worker, "num_blocks", None)
    request_blocks = _request_block_ids(meta)

    touched: list[tuple[int, ...]] = []
    seen_storage: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
    num_layers = 0
    reasons: list[str] = []
    for group_index, group in enumerate(groups):
        group_blocks = list(request_blocks[group_index]) if group_index < len(request_blocks) else []
        attention_layers = [
            name for name in group.layer_names
            if name in caches and _is_attention_layer(layer_specs.get(name, group.kv_cache_spec))
        ]
        if not attention_layers:
            continue
        positions = select_block_positions(len(group_blocks), spec)
        if positions is None:
            reasons.append(f"group{group_index}:{len(group_blocks)}-blocks")
            continue
        block_ids = tuple(group_blocks[p] for p in positions)
        for name in attention_layers:
            layer_spec = layer_specs.get(name, group.kv_cache_spec)
            page_bytes = getattr(layer_spec, "page_size_bytes", None)
            if page_bytes:
                page_bytes //= physical_per_logical
            blocks = blocks_view(
                caches[name], page_bytes, getattr(layer_spec, "dtype", None), num_blocks
            )
            # Hybrid models: vLLM lets attention layers of different KV-cache groups share one
            # tensor, each group with its own block ids. Skip only a repeat of the same blocks on
            # the same storage (a second swap would undo the first); keying on storage alone
            # touched 1 of Granite's 2 attention layers, and the zeroed first block went unseen.
            storage_key = (blocks.data_ptr(), tuple(blocks.shape), tuple(blocks.stride()),
                           block_ids)
            if storage_key in seen_storage:
                continue
            seen_storage.add(storage_key)
            if spec.kind == "corrupt-block":
                corrupt_block(blocks, block_ids[0], spec.value, generator)
            elif spec.kind == "perturb-kv":
                for block_id in block_ids:
                    perturb_block(blocks, block_id, PERTURB_SCALE, generator)
            else:
                swap_blocks(blocks, block_ids[0], block_ids[1])
            num_layers += 1
        touched.append(block_ids)
    if not touched:
        return FaultOutcome(applied=False, reason=",".join(reasons) or "no-attention-layers")
    return FaultOutcome(applied=True, block_ids=tuple(touched), num_layers=num_layers)


def _describe_caches(kv_caches: Mapping[str, Any]) -> str:
    shapes: dict[tuple, list[str]] = {}
    for name, cache in kv_caches.items():
        key = (tuple(cache.shape), tuple(cache.stride()), str(cache.dtype), str(cache.device))
        shapes.setdefault(key, []).append(name)
    return "; ".join(
        f"{len(names)}x shape={list(shape)} stride={list(stride)} dtype={dtype} "
        f"device={device} e.g. {names[0]}"
        for (shape, stride, dtype, device), names in shapes.items()
    )


def _wrap_register_kv_caches(original: Callable) -> Callable:
    @functools.wraps(original)
    def register_kv_caches(self: Any, kv_caches: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, kv_caches, *args, **kwargs)
        try:
            logger.info("%s kv caches: %s", SETUP_PREFIX, _describe_caches(kv_caches))
        except Exception:
            logger.exception("%s could not describe the kv caches", SETUP_PREFIX)
        return result

    setattr(register_kv_caches, _PATCH_MARK, True)
    return register_kv_caches


def received_request_ids(results: Any) -> set[str]:
    """Requests whose KV arrived intact, from either completion API's return value."""
    if hasattr(results, "finished_recving"):
        return set(results.finished_recving) - set(getattr(results, "failed_recving", ()) or ())
    _done_sending, done_recving = results
    return set(done_recving or ())


def _wrap_completion(original: Callable, spec: FaultSpec) -> Callable:
    import torch

    generator = torch.Generator().manual_seed(NOISE_SEED)

    @functools.wraps(original)
    def completion(self: Any, *args: Any, **kwargs: Any) -> Any:
        # The completion call pops the metadata of finished requests: keep references first.
        pending = dict(getattr(self, "_recving_metadata", None) or {})
        results = original(self, *args, **kwargs)
        if not pending:
            return results
        try:
            for request_id in sorted(received_request_ids(results)):
                meta = pending.get(request_id)
                wanted = parse_request_fault(request_id) if spec.kind == BY_REQUEST else spec
                if meta is None or wanted is None or wanted.kind not in KV_FAULT_KINDS:
                    continue    # untagged, or not a KV fault (fail-transfer: its own hook)
                try:
                    outcome = apply_fault(self, meta, wanted, generator)
                except Exception as error:  # a canary must never take the server down
                    logger.exception("%s request %s", SKIPPED_PREFIX, request_id)
                    outcome = FaultOutcome(applied=False, reason=type(error).__name__)
                logger.warning("%s", format_fault_line(request_id, wanted, outcome))
        except Exception:
            logger.exception("%s fault hook failed", SKIPPED_PREFIX)
        return results

    setattr(completion, _PATCH_MARK, True)
    return completion


def patch_worker_class(worker_class: type, spec: FaultSpec) -> bool:
    """Wrap the receive-completion method and ``register_kv_caches`` of ``worker_class``.

    The completion method is ``get_transfer_results`` where it exists (it is what
    ``get_finished`` calls there), else ``get_finished``. Idempotent, also across subclasses:
    returns True when newly patched, False when it already was.
    """
    method = "get_transfer_results" if hasattr(worker_class, "get_transfer_results") else (
        "get_finished"
    )
    original = getattr(worker_class, method)
    if getattr(original, _PATCH_MARK, False):
        return False
    setattr(worker_class, method, _wrap_completion(original, spec))
    register_kv_caches = getattr(worker_class, "register_kv_caches", None)
    if register_kv_caches is not None and not getattr(register_kv_caches, _PATCH_MARK, False):
        worker_class.register_kv_caches = _wrap_register_kv_caches(register_kv_caches)
    return True


def _make_hook(spec: FaultSpec, class_name: str = WORKER_CLASS) -> Callable[[Any], None]:
    def hook(module: Any) -> None:
        try:
            worker_class = getattr(module, class_name, None)
            if worker_class is None:
                logger.error("%s %s has no %s; fault NOT armed there", ARMED_PREFIX,
                             module.__name__, class_name)
                return
            if patch_worker_class(worker_class, spec):
                logger.warning("%s fault=%s selector=%s value=%s class=%s.%s pid=%d",
                               ARMED_PREFIX, spec.kind, spec.block, spec.value,
                               module.__name__, class_name, os.getpid())
        except Exception:
            logger.exception("%s patching %s failed; fault NOT armed", ARMED_PREFIX,
                             getattr(module, "__name__", module))

    return hook


def register() -> None:
    """vLLM ``general_plugins`` entry point: a no-op unless PD_ACCURACY_FAULT is set.

    Cheap, idempotent and never raises: the patch is applied when vLLM imports the NIXL worker
    module (a post-import hook), so processes that never load the connector stay untouched.
    The KV faults wrap the completion call (this module); fail-transfer wraps the poll of the
    read handles (:mod:`harness.serve.plugins.faults.fail_transfer`); by-request arms both.
    """
    global _registered
    if _registered:
        return
    _registered = True
    try:
        spec = parse_fault_env(os.environ)
        if spec is None:
            return
        import wrapt

        if spec.kind in KV_FAULT_KINDS or spec.kind == BY_REQUEST:
            for module_name, class_name in WORKER_TARGETS:
                wrapt.register_post_import_hook(_make_hook(spec, class_name), module_name)
        fail_transfer.arm(spec)
    except Exception:
        logger.exception("%s register() failed; no fault injected", ARMED_PREFIX)
