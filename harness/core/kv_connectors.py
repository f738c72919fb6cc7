"""The KV connectors a cell can name: the one table from a cell's ``kv_connector`` value to the
module that knows that connector (``harness.serve.connectors``) and the facts the matrix rules
check before any server starts (is vLLM's name registered, does the transport import, which
devices, does it move KV between servers at all, does the harness drive it). Adding a connector
is one row here and one module there.

Every connector vLLM CPU 0.32 registers (``KVConnectorFactory``) has a row, so that
``pd-accuracy list --show-excluded`` says for each one where it runs or why it is excluded; a row
without a module is one the harness does not drive, and says why (docs/connectors.md has the
errors each one gave when tried here).

It lives in core, not next to the connector modules, because the matrix validates cells before
anything of serve/ is imported (harness.matrix may only import core).
"""
from __future__ import annotations

from dataclasses import dataclass

_V1 = "vllm.distributed.kv_transfer.kv_connector.v1"
NIXL_TRANSPORT = "nixl._api:nixl_agent"
ANY_DEVICE = ("cpu", "cuda")


@dataclass(frozen=True)
class ConnectorRow:
    vllm_name: str               # the name vLLM's KVConnectorFactory registers it under
    transport: str               # "module:attribute" that must import for a transfer to run
    devices: tuple[str, ...]     # Cell.device values it runs on (rule known-kv-connector;
                                 # ANY_DEVICE where its package cannot be had to find out)
    module: str | None = None    # harness.serve.connectors.<name>: defines CONNECTOR; None: not driven
    # why it runs on no other device: what vLLM said when it was started there
    devices_why: str | None = None
    # None: it moves a prompt's KV from one server to another; else what it does instead
    # (rule kv-connector-moves-kv)
    moves_kv: str | None = None
    # the PyPI distribution its transport comes from, and what installing it here gave
    # (rule vllm-kv-connector names it when the transport does not import)
    package: str | None = None
    # why the harness has no module for it (rule kv-connector-driven); None with a module
    not_driven: str | None = None
    # None: its hops carry kv_transfer_params (what the proxy's drop-transfer and foreign-params
    # canaries edit); else how the decode finds the KV without them (rule known-fault)
    no_params: str | None = None


OFFLOAD_ON_GPU_ONLY = ("vLLM CPU 0.32 refuses it at start-up: 'CPU Offloading is currently only "
                       "supported on CUDA-alike and XPU GPUs'")
ONE_SERVER_TOPOLOGY = ("it offloads one server's KV to host memory and serves prefix hits from "
                       "there: a one-server topology (evict, reload, judged against a baseline "
                       "without offloading) the harness has no deployment for yet")

DEFAULT_KV_CONNECTOR = "nixl"
KV_CONNECTORS: dict[str, ConnectorRow] = {
    # pull: the decode READs the prompt's blocks from the prefill (vLLM's P/D default)
    "nixl": ConnectorRow("NixlConnector", NIXL_TRANSPORT, ("cpu", "cuda"),
                         module="harness.serve.connectors.nixl"),
    # push: the prefill WRITEs its blocks into blocks the decode allocated and registered
    "nixl-push": ConnectorRow("NixlPushConnector", NIXL_TRANSPORT, ("cpu", "cuda"),
                              module="harness.serve.connectors.nixl_push"),
    "nixl-pull": ConnectorRow(
        "NixlPullConnector", NIXL_TRANSPORT, ("cpu", "cuda"),
        not_driven="vLLM's NixlConnector is this class under its old name "
                   "(nixl/connector.py): judged as kv_connector nixl"),
    # MultiConnector with NIXL pull as its only child: the wrapper, where offloading cannot run
    "multi-nixl": ConnectorRow("MultiConnector", NIXL_TRANSPORT, ("cpu", "cuda"),
                               module="harness.serve.connectors.multi_nixl"),
    # vLLM's own CI configuration of MultiConnector: NIXL pull for P/D, offloading beside it
    "multi-nixl-offload": ConnectorRow(
        "MultiConnector", NIXL_TRANSPORT, ("cuda",),
        module="harness.serve.connectors.multi_nixl_offload",
        devices_why="its OffloadingConnector child: " + OFFLOAD_ON_GPU_ONLY),
    "mooncake": ConnectorRow(
        "MooncakeConnector", "mooncake.engine:TransferEngine", ("cuda",),
        module="harness.serve.connectors.mooncake",
        devices_why="vLLM CPU 0.32's Mooncake worker asks for the accelerator at start-up "
                    "(torch.accelerator.current_device_index(): 'RuntimeError: Cannot access "
                    "accelerator device when none is available'), with the non-cuda engine "
                    "imported",
        package="mooncake-transfer-engine-non-cuda (CPU) / mooncake-transfer-engine (CUDA); "
                "its engine.so links libibverbs.so.1 and libnl-3.so.200 (Debian libibverbs1)"),
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
        module="harness.serve.connectors.example",
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
    """The values the harness has a module for (the others are listed, with why not)."""
    return tuple(v for v, row in KV_CONNECTORS.items() if row.module is not None)


__all__ = ["DEFAULT_KV_CONNECTOR", "KV_CONNECTORS", "NIXL_TRANSPORT", "ConnectorRow",
           "connector_row", "driven_connectors"]
