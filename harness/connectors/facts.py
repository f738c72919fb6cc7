"""What the harness knows of a KV connector before any server starts: a ``kv_connector``
value's facts (:class:`ConnectorRow`), which the matrix rules check (is vLLM's name registered,
does the transport import, which devices, does it move KV between servers at all, does the
harness drive it), and what the matrix, the weathers, provenance and the verdict need to know
about it, so that none of them names one: the fault weathers it was measured under
(``weathers``), the P/D block-size shapes it accepts (``block_sizes``), how it ends a pair it
cannot serve (``refusals``), the distributions whose versions a record names
(``distributions``) and the word the verdict uses for it (``label``).

A connector package (harness/connectors/<name>/) holds its rows; what the harness does with a
driven one is its driver's (harness.connectors.driver). The rows of vLLM's connectors the
harness does not drive are in harness.connectors.vllm_registry.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

VLLM_V1 = "vllm.distributed.kv_transfer.kv_connector.v1"   # where vLLM's connectors live
ANY_DEVICE = ("cpu", "cuda")

# ConnectorRow.block_sizes: which prefill/decode block-size pairs a connector accepts
SAME_BLOCKS = "same"                   # prefill block == decode block only
DECODE_MULTIPLE = "decode-multiple"    # prefill <= decode, decode a multiple of prefill
ANY_BLOCKS = "any"                     # any pair


# what can differ between a pair's servers that a connector refuses (ConnectorRow.refusals)
KV_DTYPE_MIX = "kv-dtype-mix"            # prefill and decode KV cache dtypes differ
KV_LAYERS_MIX = "kv-layers-mix"          # the decode has KV layers the prefill lacks (a draft)
KV_HEAD_MIX = "kv-head-mix"              # the decode runs a draft head (EAGLE, MTP) the prefill lacks
PERMUTE_HYBRID = "permute-hybrid"        # an NHD decode permuting a hybrid model's blocks
REFUSAL_KINDS = (KV_DTYPE_MIX, KV_LAYERS_MIX, KV_HEAD_MIX, PERMUTE_HYBRID)


@dataclass(frozen=True)
class Refusal:
    """How a connector ends a pair it cannot serve, once it runs: the reason the matrix states
    and the pattern the verdict's reason must match to be that refusal (an expected failure)."""

    how: str
    fails_with: str | None = None     # None: any FAIL is the refusal (its words not measured)


@dataclass(frozen=True)
class ConnectorRow:
    vllm_name: str               # the name vLLM's KVConnectorFactory registers it under
    transport: str               # "module:attribute" that must import for a transfer to run
    devices: tuple[str, ...]     # Cell.device values it runs on (rule known-kv-connector;
                                 # ANY_DEVICE where its package cannot be had to find out)
    # True: the harness drives it (its package's DRIVERS hold one under this row's value);
    # False: moves_kv or not_driven says why not
    driven: bool = False
    # why it runs on no other device: what vLLM said when it was started there
    devices_why: str | None = None
    # None: it moves a prompt's KV from one server to another; else what it does instead
    # (rule kv-connector-moves-kv)
    moves_kv: str | None = None
    # the PyPI distribution its transport comes from, and what installing it here gave
    # (rule vllm-kv-connector names it when the transport does not import)
    package: str | None = None
    # why the harness does not drive it (rule kv-connector-driven); None when driven
    not_driven: str | None = None
    # None: its hops carry kv_transfer_params (what the proxy's drop-transfer and foreign-params
    # canaries edit); else how the decode finds the KV without them (rule known-fault)
    no_params: str | None = None
    # the word the matrix's reasons and the verdict use for it; vllm_name when empty
    label: str = ""
    # the weathers that drive a connector's own machinery (its lease, its read poll, its
    # reconnection) it was measured under; the general ones run with any connector
    weathers: tuple[str, ...] = ()
    # the block-size pairs it accepts (rule heterogeneous-block-sizes) and why
    block_sizes: str = SAME_BLOCKS
    block_sizes_why: str = "P != D block sizes were not run with it: excluded until measured"
    # how it ends a pair it cannot serve, by what differs between prefill and decode (one of
    # REFUSAL_KINDS); a kind it lacks: not measured (an xfail rule then takes any FAIL)
    refusals: Mapping[str, Refusal] = field(default_factory=dict)
    # the KV cache layout it asks for on both sides (get_required_kvcache_layout); None: none
    kv_layout: str | None = None
    # PyPI distributions its transport ships as, first the name a record's versions use
    # (harness.run.evidence.provenance); empty: it is vLLM's own code
    distributions: tuple[str, ...] = ()
    # pins a vLLM release's environment installs for it without their dependencies, as
    # bootstrap.sh does (harness.run.releases)
    release_pins: tuple[str, ...] = ()

    @property
    def word(self) -> str:
        return self.label or self.vllm_name


__all__ = ["ANY_BLOCKS", "ANY_DEVICE", "DECODE_MULTIPLE", "KV_DTYPE_MIX", "KV_HEAD_MIX",
           "KV_LAYERS_MIX",
           "PERMUTE_HYBRID", "REFUSAL_KINDS", "SAME_BLOCKS", "VLLM_V1", "ConnectorRow", "Refusal"]
