"""vLLM general plugin: canary faults injected into the *decode* server's received KV cache.

The harness must prove it can see broken KV transfer, so a decode server started with
``PD_ACCURACY_FAULT`` corrupts each request's KV right after its connector has finished
receiving it and before the first decode step attends to it. Which fault, which block, and the
log lines that report it are in :mod:`harness.protocol.faults`; this module does the
corrupting.

Where it hooks: the connector interface's ``received`` event
(:mod:`harness.serve.plugins.kv_events.interface`): the worker connector's
``get_transfer_results`` / ``get_finished`` reported the request in ``finished_recving`` and not
in ``failed_recving``, after the connector's own post-processing. The scheduler only makes
those requests runnable after it sees that result, so the corruption always precedes their first
decode step. Block ids are the request's received scheduler blocks expanded to kernel blocks
(what dim 0 of the cache tensors indexes); SSM/Mamba layers are never touched.
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from harness import weathers
from harness.serve.plugins.faults import early_release, fail_transfer, wrong_drafts
from harness.serve.plugins.kv_events import interface
from harness.serve.plugins.kv_events.interface import KVView, Received
from harness.serve.plugins.kv_events.view import is_attention_layer
from harness.protocol.faults import (
    ARMED_PREFIX,
    BY_REQUEST,
    DEFAULT_PERTURB_SCALE,
    DRAFT_KV,
    KV_FAULT_KINDS,
    SETUP_PREFIX,
    SKIPPED_PREFIX,
    FaultOutcome,
    FaultSpec,
    format_fault_line,
    is_draft_layer,
    parse_fault_env,
    parse_request_fault,
    perturb_scale,
    select_block_positions,
)
from harness.serve.plugins.entry import vllm_plugin

if TYPE_CHECKING:
    import torch

# Child of vLLM's "vllm" logger so the lines land in the decode server's log in vLLM's format.
logger = logging.getLogger("vllm.pd_accuracy.faults")

FAULT_ORDER = 10     # before the KV digest (order 90): a canary's damage is in the digest
# Noise is reproducible run to run: a canary that changes between runs would be noise itself.
NOISE_SEED = 0
try:
    PERTURB_SCALE = perturb_scale(os.environ)
except ValueError:  # reported by parse-time validation in the harness; never raise in vLLM
    PERTURB_SCALE = DEFAULT_PERTURB_SCALE



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


def apply_fault(view: KVView, block_ids: Sequence[Sequence[int]], spec: FaultSpec,
                generator: Any = None) -> FaultOutcome:
    """Apply ``spec`` to one received request: ``block_ids`` are its scheduler block ids per
    transfer group (expanded to kernel blocks here). Only attention layers are touched; a
    storage aliased by several layers is touched once per block list."""
    touched: list[tuple[int, ...]] = []
    seen_storage: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
    num_layers = 0
    reasons: list[str] = []
    for group_index, group in enumerate(view.groups):
        group_blocks = (view.kernel_ids(block_ids[group_index])
                        if group_index < len(block_ids) else [])
        attention_layers = [
            name for name in group.layer_names
            if name in view.caches and is_attention_layer(
                view.layer_specs.get(name, group.kv_cache_spec))
            and (spec.kind != DRAFT_KV or name in view.draft_layers or is_draft_layer(name))]
        if not attention_layers:
            continue
        positions = select_block_positions(len(group_blocks), spec)
        if positions is None:
            reasons.append(f"group{group_index}:{len(group_blocks)}-blocks")
            continue
        chosen = tuple(group_blocks[p] for p in positions)
        for name in attention_layers:
            blocks = _layer_blocks(view, name, group)
            # Hybrid models: vLLM lets attention layers of different KV-cache groups share one
            # tensor, each group with its own block ids. Skip only a repeat of the same blocks on
            # the same storage (a second swap would undo the first); keying on storage alone
            # touched 1 of Granite's 2 attention layers, and the zeroed first block went unseen.
            storage_key = (blocks.data_ptr(), tuple(blocks.shape), tuple(blocks.stride()), chosen)
            if storage_key in seen_storage:
                continue
            seen_storage.add(storage_key)
            _break(blocks, chosen, spec, generator)
            num_layers += 1
        touched.append(chosen)
    if not touched:
        nothing = "no-draft-layers" if spec.kind == DRAFT_KV else "no-attention-layers"
        return FaultOutcome(applied=False, reason=",".join(reasons) or nothing)
    return FaultOutcome(applied=True, block_ids=tuple(touched), num_layers=num_layers)


def _layer_blocks(view: KVView, name: str, group: Any) -> "torch.Tensor":
    layer_spec = view.layer_specs.get(name, group.kv_cache_spec)
    page_bytes = getattr(layer_spec, "page_size_bytes", None)
    if page_bytes:
        page_bytes //= view.blocks_per_logical
    return blocks_view(view.caches[name], page_bytes, getattr(layer_spec, "dtype", None),
                       view.num_kernel_blocks)


def _break(blocks: "torch.Tensor", block_ids: tuple[int, ...], spec: FaultSpec,
           generator: Any) -> None:
    if spec.kind == "corrupt-block":
        corrupt_block(blocks, block_ids[0], spec.value, generator)
    elif spec.kind == DRAFT_KV:
        for block_id in block_ids:
            corrupt_block(blocks, block_id, spec.value, generator)
    elif spec.kind == "perturb-kv":
        for block_id in block_ids:
            perturb_block(blocks, block_id, PERTURB_SCALE, generator)
    else:
        swap_blocks(blocks, block_ids[0], block_ids[1])


def describe_caches(kv_caches: Mapping[str, Any]) -> str:
    """One line per distinct (shape, stride, dtype, device) of the registered caches."""
    shapes: dict[tuple, list[str]] = {}
    for name, cache in kv_caches.items():
        key = (tuple(cache.shape), tuple(cache.stride()), str(cache.dtype), str(cache.device))
        shapes.setdefault(key, []).append(name)
    return "; ".join(
        f"{len(names)}x shape={list(shape)} stride={list(stride)} dtype={dtype} "
        f"device={device} e.g. {names[0]}"
        for (shape, stride, dtype, device), names in shapes.items()
    )


def on_registered(connector: Any, view: KVView) -> None:
    """Event ``registered``: the caches a canary will break, in the server log."""
    logger.info("%s kv caches: %s (connector %s)", SETUP_PREFIX, describe_caches(view.caches),
                type(connector).__name__)


def make_on_received(spec: FaultSpec) -> Callable[[Any, KVView | None, Received], None]:
    """Event ``received``: break the request's KV as ``spec`` (or its id's tag) asks, one
    fault line each; never raises."""
    import torch

    generator = torch.Generator().manual_seed(NOISE_SEED)

    def on_received(connector: Any, view: KVView | None, request: Received) -> None:
        wanted = parse_request_fault(request.request_id) if spec.kind == BY_REQUEST else spec
        if wanted is None or wanted.kind not in KV_FAULT_KINDS:
            return      # untagged, or not a KV fault (fail-transfer: its own event)
        try:
            if view is None:
                raise RuntimeError("no KV caches registered")
            outcome = apply_fault(view, request.block_ids, wanted, generator)
        except Exception as error:  # a canary must never take the server down
            logger.exception("%s request %s", SKIPPED_PREFIX, request.request_id)
            outcome = FaultOutcome(applied=False, reason=type(error).__name__)
        logger.warning("%s", format_fault_line(request.request_id, wanted, outcome))

    return on_received


def arm(spec: FaultSpec) -> None:
    """Subscribe the KV faults of ``spec`` to the connector interface's events."""
    interface.subscribe("registered", on_registered, FAULT_ORDER)
    interface.subscribe("received", make_on_received(spec), FAULT_ORDER)
    interface.install()
    logger.warning("%s fault=%s selector=%s value=%s on the connector interface pid=%d",
                   ARMED_PREFIX, spec.kind, spec.block, spec.value, os.getpid())


@vllm_plugin(logger, f"{ARMED_PREFIX} register() failed; no fault injected")
def register() -> None:
    """vLLM ``general_plugins`` entry point: a no-op unless PD_ACCURACY_FAULT is set.

    Cheap, idempotent and never raises: the hooks are put on a connector class when vLLM's
    connector factory hands it out, so processes that never build a connector stay untouched.
    The KV faults act on the ``received`` event (this module); fail-transfer on ``arrived``
    (:mod:`harness.serve.plugins.faults.fail_transfer`); wrong-drafts on the model runner's
    proposer (:mod:`harness.serve.plugins.faults.wrong_drafts`); by-request arms them all, and every
    weather's fault in the decode (its package's ``in_server``: a tagged request's late read).
    """
    early_release.arm()     # a prefill's fault (PD_ACCURACY_PREFILL_FAULT); no-op elsewhere
    spec = parse_fault_env(os.environ)
    if spec is None:
        return
    if spec.kind in KV_FAULT_KINDS or spec.kind == BY_REQUEST:
        arm(spec)
    fail_transfer.arm(spec)
    wrong_drafts.arm(spec)
    if spec.kind == BY_REQUEST:
        for package in weathers.packages():
            for module in interface.in_server_modules(package):
                module.arm()
