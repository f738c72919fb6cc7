"""The KV connectors a cell can name: the one table of each ``kv_connector`` value's facts that
the matrix rules check before any server starts (is vLLM's name registered, does the transport
import, which devices, does it move KV between servers at all, does the harness drive it). The
driver of a ``driven`` row is a module of ``harness.serve.connectors``, registered there under
the row's value. Adding a connector is one row here and one registered module there.

Every connector vLLM CPU 0.32 registers (``KVConnectorFactory``) has a row, so that
``pd-accuracy list --show-excluded`` says for each one where it runs or why it is excluded; a row
the harness does not drive says why (docs/connectors.md has the errors each one gave when tried
here).

A row also carries what the matrix, the weathers, provenance and the verdict need to know about
its connector, so that none of them names one: the weathers it can be judged in beyond the
general ones (``weathers``), the P/D block-size shapes it accepts (``block_sizes``), how it ends a
pair whose two KV caches differ in dtype (``dtype_mix``), the distributions whose versions a
record names (``distributions``) and the word the verdict uses for it (``label``). The rest of
what the harness does with a connector is its module's (``harness.serve.connectors.base``).

It lives in core, not next to the connector modules, because the matrix validates cells before
anything of serve/ is imported (harness.matrix may only import core).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

_V1 = "vllm.distributed.kv_transfer.kv_connector.v1"
NIXL_TRANSPORT = "nixl._api:nixl_agent"
ANY_DEVICE = ("cpu", "cuda")
# the weathers that drive a connector's own machinery (its lease, its read poll, its
# reconnection), each run only with connectors whose row lists it (harness.core.weathers)
NIXL_WEATHERS = ("expiry", "load-failures", "aborts", "restart")

# ConnectorRow.block_sizes: which prefill/decode block-size pairs a connector accepts
SAME_BLOCKS = "same"                   # prefill block == decode block only
DECODE_MULTIPLE = "decode-multiple"    # prefill <= decode, decode a multiple of prefill
ANY_BLOCKS = "any"                     # any pair


# what can differ between a pair's servers that a connector refuses (ConnectorRow.refusals)
KV_DTYPE_MIX = "kv-dtype-mix"            # prefill and decode KV cache dtypes differ
KV_LAYERS_MIX = "kv-layers-mix"          # the decode has KV layers the prefill lacks (a draft)
PERMUTE_HYBRID = "permute-hybrid"        # an NHD decode permuting a hybrid model's blocks
REFUSAL_KINDS = (KV_DTYPE_MIX, KV_LAYERS_MIX, PERMUTE_HYBRID)


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
    # True: the harness drives it (its connector module in harness.serve.connectors registers
    # under this row's value); False: moves_kv or not_driven says why not
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
    # the word the matrix's reasons and the verdict use for it ("NIXL (push)"); vllm_name when
    # empty
    label: str = ""
    # the weathers of NIXL_WEATHERS-like machinery it supports (the general ones run anywhere)
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

    @property
    def word(self) -> str:
        return self.label or self.vllm_name


OFFLOAD_ON_GPU_ONLY = ("vLLM CPU 0.32 refuses it at start-up: 'CPU Offloading is currently only "
                       "supported on CUDA-alike and XPU GPUs'")
ONE_SERVER_TOPOLOGY = ("it offloads one server's KV to host memory and serves prefix hits from "
                       "there: a one-server topology (evict, reload, judged against a baseline "
                       "without offloading) the harness has no deployment for yet")

# NIXL's facts, shared by every row whose transfer is NIXL's
NIXL_DISTRIBUTIONS = ("nixl", "nixl-cu12", "nixl-cu13")
NIXL_BLOCKS_WHY = ("NIXL post-processes received blocks only from a smaller prefill block into "
                   "a decode block that is a multiple of it")
_ALL_REQUESTS_FAILED = (r"P/D evaluation failed: RequestsFailed: requests failed on \d+ of \d+ "
                        r"questions: ")
NIXL_REFUSALS = {
    KV_DTYPE_MIX: Refusal(
        how="vLLM hashes cache_dtype into the NIXL compatibility hash, so the decode's handshake "
            "refuses the prefill ('NIXL compatibility hash mismatch') and every request errors "
            "(kv_load_failure_policy fail)",
        fails_with=_ALL_REQUESTS_FAILED + ".*NIXL compatibility hash mismatch"),
    KV_LAYERS_MIX: Refusal(
        how="vLLM hashes only EAGLE/MTP drafts into the NIXL compatibility hash, so the "
            "handshake gets past it and _validate_remote_agent_handshake asserts 'Number of KV "
            "layers must match between prefill and decode': every request errors "
            "(kv_load_failure_policy fail)",
        fails_with=_ALL_REQUESTS_FAILED
        + ".*Number of KV layers must match between prefill and decode"),
    PERMUTE_HYBRID: Refusal(
        how="an NHD decode permutes the HND blocks it receives (enable_permute_local_kv), and "
            "NIXL asserts 'HMA does not support block size post processing' for a hybrid model "
            "(its Mamba/GDN groups need the hybrid KV cache manager)"),
}
NIXL_FACTS = dict(label="NIXL", block_sizes=DECODE_MULTIPLE, block_sizes_why=NIXL_BLOCKS_WHY,
                  refusals=NIXL_REFUSALS, kv_layout="HND", distributions=NIXL_DISTRIBUTIONS)

DEFAULT_KV_CONNECTOR = "nixl"
KV_CONNECTORS: dict[str, ConnectorRow] = {
    # pull: the decode READs the prompt's blocks from the prefill (vLLM's P/D default)
    "nixl": ConnectorRow("NixlConnector", NIXL_TRANSPORT, ("cpu", "cuda"),
                         driven=True, weathers=NIXL_WEATHERS,
                         **NIXL_FACTS),
    # push: the prefill WRITEs its blocks into blocks the decode allocated and registered
    # (expiry and aborts were built and measured on the pull's lease; not run with push yet)
    "nixl-push": ConnectorRow("NixlPushConnector", NIXL_TRANSPORT, ("cpu", "cuda"),
                              driven=True,
                              weathers=("load-failures", "restart"),
                              **{**NIXL_FACTS, "label": "NIXL (push)"}),
    "nixl-pull": ConnectorRow(
        "NixlPullConnector", NIXL_TRANSPORT, ("cpu", "cuda"),
        not_driven="vLLM's NixlConnector is this class under its old name "
                   "(nixl/connector.py): judged as kv_connector nixl", **NIXL_FACTS),
    # MultiConnector with NIXL pull as its only child: the wrapper, where offloading cannot run
    "multi-nixl": ConnectorRow("MultiConnector", NIXL_TRANSPORT, ("cpu", "cuda"),
                               driven=True,
                               **{**NIXL_FACTS, "label": "MultiConnector (NIXL)"}),
    # vLLM's own CI configuration of MultiConnector: NIXL pull for P/D, offloading beside it
    "multi-nixl-offload": ConnectorRow(
        "MultiConnector", NIXL_TRANSPORT, ("cuda",),
        driven=True,
        devices_why="its OffloadingConnector child: " + OFFLOAD_ON_GPU_ONLY,
        **{**NIXL_FACTS, "label": "MultiConnector (NIXL + offloading)"}),
    "mooncake": ConnectorRow(
        "MooncakeConnector", "mooncake.engine:TransferEngine", ("cuda",),
        driven=True,
        devices_why="vLLM CPU 0.32's Mooncake worker asks for the accelerator at start-up "
                    "(torch.accelerator.current_device_index(): 'RuntimeError: Cannot access "
                    "accelerator device when none is available'), with the non-cuda engine "
                    "imported",
        package="mooncake-transfer-engine-non-cuda (CPU) / mooncake-transfer-engine (CUDA); "
                "its engine.so links libibverbs.so.1 and libnl-3.so.200 (Debian libibverbs1)",
        label="Mooncake (TCP)",
        distributions=("mooncake-transfer-engine", "mooncake-transfer-engine-cuda13",
                       "mooncake-transfer-engine-non-cuda")),
    "offloading": ConnectorRow(
        "OffloadingConnector", f"{_V1}.offloading_connector:OffloadingConnector", ("cuda",),
        devices_why=OFFLOAD_ON_GPU_ONLY, not_driven=ONE_SERVER_TOPOLOGY),
    "simple-cpu-offload": ConnectorRow(
        "SimpleCPUOffloadConnector",
        f"{_V1}.simple_cpu_offload_connector:SimpleCPUOffloadConnector", ("cuda",),
        devices_why="vLLM CPU 0.32 fails at start-up registering the KV caches (it asks for a "
                    "CUDA stream: \"AttributeError: type object '_StreamPlaceholder' has no "
                    "attribute 'priority_range'\")", not_driven=ONE_SERVER_TOPOLOGY),
    "lmcache": ConnectorRow(
        "LMCacheConnectorV1", "lmcache.integration.vllm.vllm_v1_adapter:LMCacheConnectorV1Impl",
        ("cuda",), package="lmcache",
        devices_why="lmcache 0.5.6 installs and vLLM CPU starts with it, but LMCache has no "
                    "CPU path ('RuntimeError: No supported cpu connector found.': it runs in "
                    "'degraded mode (recompute)', 0 hit tokens on a repeated prompt), and its "
                    "kernels (lmcache.cuda_ops) link libc10_cuda.so",
        not_driven="an LMCache cache shared by prefill and decode (its own config, storage "
                   "backend and lookup server): no harness module yet"),
    "lmcache-mp": ConnectorRow(
        "LMCacheMPConnector",
        "lmcache.integration.vllm.vllm_multi_process_adapter:LMCacheMPSchedulerAdapter",
        ("cuda",), package="lmcache",
        devices_why="as lmcache: its kernels link libc10_cuda.so",
        not_driven="talks to a separate LMCache multi-process server (ZMQ) the harness does "
                   "not start"),
    "mooncake-store": ConnectorRow(
        "MooncakeStoreConnector", "mooncake.store:MooncakeDistributedStore", ANY_DEVICE,
        package="mooncake-transfer-engine",
        not_driven="a KV store, not a P/D link: needs a Mooncake master and metadata server "
                   "the harness does not start"),
    "flexkv": ConnectorRow(
        "FlexKVConnectorV1", "flexkv.integration.vllm.vllm_v1_adapter:FlexKVConnectorV1Impl",
        ANY_DEVICE, package="flexkv (pip: 'No matching distribution found for flexkv'; built "
                           "from its GitHub repository only)",
        not_driven="a KV cache offloading service of its own: no harness module"),
    "hf3fs": ConnectorRow(
        "HF3FSKVConnector", "hf3fs_fuse.io:deregister_fd", ANY_DEVICE,
        package="hf3fs_fuse (pip: 'No matching distribution found for hf3fs_fuse'; ships "
                "with a 3FS cluster)",
        not_driven="stores KV on a 3FS distributed file system: none here"),
    "moriio": ConnectorRow(
        "MoRIIOConnector", "mori.io:IOEngine", ("rocm",),
        devices_why="AMD's MoRI-IO: ROCm GPUs only",
        package="mori (pip: 'No matching distribution found for mori')",
        not_driven="P/D over AMD's MoRI-IO (RDMA between ROCm GPUs): no ROCm machine to run it"),
    # vLLM's teaching connector: the prefill saves each prompt's KV into files, the decode loads
    # them by the prompt's hash (harness.serve.connectors.example)
    "example": ConnectorRow(
        "ExampleConnector", f"{_V1}.example_connector:ExampleConnector", ("cpu", "cuda"),
        driven=True, label="ExampleConnector (files)",
        no_params="the decode finds the prompt's KV by the hash of its tokens in the shared "
                  "directory; no kv_transfer_params cross"),
    "example-hidden-states": ConnectorRow(
        "ExampleHiddenStatesConnector",
        f"{_V1}.example_hidden_states_connector:ExampleHiddenStatesConnector", ("cpu", "cuda"),
        moves_kv="it writes a request's hidden states to disk for speculative-decoding "
                 "draft training"),
    "decode-bench": ConnectorRow(
        "DecodeBenchConnector", f"{_V1}.decode_bench_connector:DecodeBenchConnector",
        ("cpu", "cuda"),
        moves_kv="it fills the decode's KV cache with dummy values to benchmark decoding "
                 "alone"),
    "hisparse": ConnectorRow(
        "HiSparseConnector", f"{_V1}.hisparse.connector:HiSparseConnector", ("cuda",),
        moves_kv="it pages one server's sparse-attention KV between its GPU and its own host "
                 "pool ('HiSparseConnector requires a HiSparse host pool')"),
}


def connector_row(value: str) -> ConnectorRow:
    """The row of ``value``; KeyError names the known values."""
    try:
        return KV_CONNECTORS[value]
    except KeyError:
        raise KeyError(f"unknown kv_connector {value!r}; use one of {', '.join(KV_CONNECTORS)}") from None


def driven_connectors() -> tuple[str, ...]:
    """The values the harness drives (the others are listed, with why not)."""
    return tuple(v for v, row in KV_CONNECTORS.items() if row.driven)


__all__ = ["ANY_BLOCKS", "DECODE_MULTIPLE", "DEFAULT_KV_CONNECTOR", "KV_CONNECTORS", "NIXL_TRANSPORT",
           "KV_DTYPE_MIX", "KV_LAYERS_MIX", "PERMUTE_HYBRID", "REFUSAL_KINDS", "SAME_BLOCKS",
           "ConnectorRow", "Refusal", "connector_row", "driven_connectors"]
