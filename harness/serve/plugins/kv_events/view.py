"""The KV caches a worker's connector was handed, and how to read them (:class:`KVView`).

Built from what every connector gets through vLLM's interface: the caches of
``register_kv_caches`` and the connector's ``KVCacheConfig`` and ``VllmConfig``. The attention
kernel's block size is vLLM's own choice (``select_common_block_size`` over the transfer layers'
backends): a scheduler block of 128 tokens may be several kernel blocks, and dim 0 of a cache
indexes kernel blocks. vLLM is imported only inside :func:`build_view`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class KVView:
    """The KV caches a worker's connector was given and how to read them: ``caches`` per layer,
    ``groups`` (``layer_names``, ``kv_cache_spec`` per transfer group), per-layer specs, the
    attention kernel's block size and kernel blocks per scheduler block, the backend's name, the
    TP rank; ``moved``: the buffers the connector moves KV through when not the caches;
    ``draft_layers``: which of the caches are the speculative drafter's."""

    caches: Mapping[str, Any]
    groups: Sequence[Any]
    layer_specs: Mapping[str, Any]
    kernel_block_size: int
    blocks_per_logical: int = 1
    backend: str = ""
    tp_rank: int = 0
    num_kernel_blocks: int | None = None
    moved: Mapping[str, Any] | None = None
    # the layers of the server's speculative drafter (a draft model's, an EAGLE head's):
    # harness.protocol.faults.draft_layer_names
    draft_layers: frozenset = frozenset()

    def kernel_ids(self, logical_ids: Sequence[int]) -> list[int]:
        """The kernel blocks (what dim 0 of a cache indexes) under scheduler blocks."""
        ratio = self.blocks_per_logical
        return [int(b) * ratio + i for b in logical_ids for i in range(ratio)]


def _is_spec_named(spec_or_type: Any, class_name: str) -> bool:
    # By class name along the MRO: importable without vLLM, tolerant of the spec classes moving
    spec_type = spec_or_type if isinstance(spec_or_type, type) else type(spec_or_type)
    return any(klass.__name__ == class_name for klass in spec_type.__mro__)


def is_attention_spec(spec_or_type: Any) -> bool:
    """True for attention KV specs (full, sliding, MLA...), False for Mamba/SSM and others."""
    return _is_spec_named(spec_or_type, "AttentionSpec") and not _is_spec_named(
        spec_or_type, "MambaSpec")


def is_attention_layer(spec: Any) -> bool:
    """A layer of unknown spec is taken for attention (pre-HMA configs name none)."""
    return spec is None or is_attention_spec(representative(spec))


def representative(spec: Any) -> Any:
    """A group spec's layer spec: the first of a ``UniformTypeKVCacheSpecs`` wrapper's."""
    inner = getattr(spec, "kv_cache_specs", None)
    return next(iter(inner.values())) if isinstance(inner, Mapping) and inner else spec


@dataclass(frozen=True)
class _AllLayersGroup:
    layer_names: list[str]
    kv_cache_spec: Any = None


def transfer_groups(kv_cache_config: Any, caches: Mapping[str, Any]) -> Sequence[Any]:
    """The config's transfer groups (its KV cache groups on older vLLM); without a config,
    one group of every cache (a pre-HMA connector: all attention)."""
    groups = getattr(kv_cache_config, "transfer_groups", None)
    if groups is None and kv_cache_config is not None:
        groups = getattr(kv_cache_config, "kv_cache_groups", None)
    return list(groups) if groups is not None else [_AllLayersGroup(list(caches))]


def layer_specs(groups: Sequence[Any]) -> dict[str, Any]:
    specs: dict[str, Any] = {}
    for group in groups:
        inner = getattr(group.kv_cache_spec, "kv_cache_specs", None)
        if isinstance(inner, Mapping):
            specs.update(inner)
        else:
            specs.update(dict.fromkeys(group.layer_names, group.kv_cache_spec))
    return specs


def drafter_layers(vllm_config: Any, names: Sequence[str]) -> frozenset:
    """The drafter's layers among ``names`` under ``vllm_config``'s speculative config (none
    without one): an EAGLE head's layers are numbered after the target's
    (``model_config.get_num_layers``, what vLLM's EAGLE models start their numbering at)."""
    from harness.protocol.faults import draft_layer_names

    speculative = getattr(vllm_config, "speculative_config", None)
    method = getattr(speculative, "method", None) if speculative is not None else None
    target_layers = None
    try:
        target_layers = int(vllm_config.model_config.get_num_layers(vllm_config.parallel_config))
    except Exception:  # noqa: BLE001  (an older vLLM, a config without layers: names alone)
        pass
    return draft_layer_names(names, method, target_layers)


def build_view(connector: Any, caches: Mapping[str, Any]) -> KVView:
    """The view of a worker connector's caches (``KVConnectorBase_V1`` keeps its configs as
    ``_vllm_config`` and ``_kv_cache_config``)."""
    from vllm.distributed.kv_transfer.kv_connector import utils as kv_utils
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
    from vllm.v1.worker.utils import select_common_block_size

    vllm_config, kv_cache_config = connector._vllm_config, connector._kv_cache_config
    groups = transfer_groups(kv_cache_config, caches)
    sizes = [int(g.kv_cache_spec.block_size) for g in groups
             if is_attention_spec(representative(g.kv_cache_spec))]
    logical = math.lcm(*sizes) if sizes else int(vllm_config.cache_config.block_size)
    backends = kv_utils.get_current_attn_backends(vllm_config)
    with_specs = getattr(kv_utils, "get_current_attn_backends_and_specs", None)
    kernel = (select_common_block_size(logical, backends) if with_specs is None   # vLLM 0.26
              else select_common_block_size(
                  logical, *with_specs(vllm_config, kv_cache_config, backends)))
    num_blocks = getattr(kv_cache_config, "num_blocks", None)
    return KVView(caches=caches, groups=groups, layer_specs=layer_specs(groups),
                  kernel_block_size=int(kernel), blocks_per_logical=logical // int(kernel),
                  backend=str(backends[0].get_name()),
                  tp_rank=int(get_tensor_model_parallel_rank()),
                  num_kernel_blocks=None if num_blocks is None else
                  int(num_blocks) * (logical // int(kernel)),
                  draft_layers=drafter_layers(vllm_config, list(caches)))
