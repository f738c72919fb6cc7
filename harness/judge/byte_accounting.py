"""Exact byte accounting of the KV connector: the bytes that should have crossed, request by
request, against the bytes the connector's /metrics say it moved (harness.connectors: a
connector whose ``byte_accounting`` is None cannot be held to a count).

Why: the transfer checks before this only asked for bytes > 0. A fault that skipped the last
block pair of every READ moved 39,321,600 bytes instead of 52,428,800 (75 %) while the scheduler
still counted every prompt token as external, and passed them.

Expected bytes, per request of the proxy's records (the kv_transfer_params listing the blocks
that crossed: the decode's for a pull connector, the prefill's answer for a push one):
``attention blocks x prefill block size x attention bytes per token`` (the attention groups all
list the same blocks; a recurrent-state group lists one, so the longest list is the attention
one) plus ``state layers x state bytes per layer`` for a hybrid. Prompt tokens the decode found in
its own prefix cache are not read, so they are taken off (whole blocks, as vLLM caches them).
With sliding-window layers every KV cache group counts on its own: its real block ids (a sliding
group lists the null block for blocks out of its window) x block size x the group size (its
layers and vLLM's padding: harness.core.kv_geometry.kv_cache_groups) x one layer's bytes; params
listing another number of groups than the geometry's cannot be counted (GeometryUnknown).
The geometry comes from harness.core.kv_geometry; the formula matched the connector's own
count to the byte on every committed CPU and H200 record (see that module).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

from harness.core.kv_geometry import GeometryUnknown, KvGeometry


@dataclass(frozen=True)
class ByteAccount:
    expected: int            # bytes the decode should have read over the evaluation
    actual: int              # the connector's kv_bytes over the same window
    requests: int            # requests counted (those that received transfer params)
    attention_blocks: int    # prefill blocks listed for the attention layers, summed
    state_bytes: int         # recurrent-state bytes included in `expected`
    cache_hit_bytes: int     # bytes not read because decode held them in its prefix cache

    @property
    def exact(self) -> bool:
        return self.expected == self.actual

    def detail(self) -> str:
        if self.exact:
            return (f"the connector moved exactly the expected {self.actual:,} bytes for {self.requests} "
                    f"requests ({self.attention_blocks} prefill blocks)")
        gap = self.actual - self.expected
        share = 100.0 * self.actual / self.expected if self.expected else float("inf")
        return (f"the connector moved {self.actual:,} bytes, expected {self.expected:,} for "
                f"{self.requests} requests ({self.attention_blocks} prefill blocks): "
                f"{'short by' if gap < 0 else 'excess of'} {abs(gap):,} bytes ({share:.1f} %)")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exact": self.exact, "detail": self.detail()}


NULL_BLOCK = 0     # vLLM's block pool reserves id 0 as the null block; never read


def attention_blocks(params: dict) -> int:
    """Blocks of the attention layers in one request's kv_transfer_params (0 without any)."""
    groups = params.get("remote_block_ids") or []
    return max((len(g) for g in groups), default=0)


def windowed_group_blocks(params: dict) -> tuple[int, int]:
    """(real block ids summed over the KV cache groups, number of groups) of a model with
    sliding-window layers: a sliding group lists the null block for blocks out of its window."""
    groups = params.get("remote_block_ids") or []
    return sum(sum(1 for b in g if b != NULL_BLOCK) for g in groups), len(groups)


def account(params_per_request: Iterable[dict | None], geometry: KvGeometry,
            prefill_block_size: int, actual_bytes: float, state_bytes_per_layer: int = 0,
            cache_hit_tokens: float = 0.0) -> ByteAccount:
    """The ByteAccount of one evaluation window: each request's params listing its blocks, the
    model's geometry, the prefill server's (logical) block size, the connector's bytes delta.
    GeometryUnknown when the params' KV cache groups are not the geometry's."""
    per_token = geometry.attention_bytes_per_token
    groups = geometry.cache_groups
    requests = blocks = 0
    attention = 0
    for params in params_per_request:
        if not params:
            continue
        requests += 1
        if geometry.sliding_layers:
            real, listed = windowed_group_blocks(params)
            if listed != len(groups):
                raise GeometryUnknown(f"the params list {listed} KV cache groups, the geometry "
                                      f"has {len(groups)}: vLLM grouped the layers otherwise")
            # every group spans the same slots (padding included): a real id is that many pages
            blocks += real
            attention += real * prefill_block_size * groups[0].slots * geometry.layer_bytes_per_token
        else:
            listed = attention_blocks(params)
            blocks += listed
            attention += listed * prefill_block_size * per_token
    state = requests * geometry.state_layers * state_bytes_per_layer
    hit = int(cache_hit_tokens) * per_token
    expected = attention + state - hit
    return ByteAccount(expected=expected, actual=int(actual_bytes), requests=requests,
                       attention_blocks=blocks, state_bytes=state, cache_hit_bytes=hit)


__all__ = ["ByteAccount", "account", "attention_blocks"]
