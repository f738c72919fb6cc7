"""vLLM's KV connectors as the harness lists them: vLLM's P/D default, the order lists and
help show every ``kv_connector`` value in, and the rows of the connectors vLLM registers
(``KVConnectorFactory``, vLLM CPU 0.32) that the harness does not drive, each saying why: so
that ``pd-accuracy list --show-excluded`` says for every one where it runs or why it is excluded
(docs/connectors.md has the errors each one gave when tried here). A connector the harness
drives has its rows in its own package (harness/connectors/<name>/), an old name of a driven
class too (judged as that class); driving one of these is a new package, and its row leaves this
table.
"""
from __future__ import annotations

from harness.connectors.facts import ANY_DEVICE, VLLM_V1, ConnectorRow

# vLLM's P/D default (a cell's kv_connector when it names none; absent from cell ids)
DEFAULT_KV_CONNECTOR = "nixl"
# every value, in the order lists, help and reasons show them; a package's value missing here
# comes after these, in the order the packages are found
LISTED = ("nixl", "nixl-push", "nixl-pull", "multi-nixl", "multi-nixl-offload", "mooncake",
          "offloading", "simple-cpu-offload", "lmcache", "lmcache-mp", "mooncake-store", "flexkv",
          "hf3fs", "moriio", "example", "example-hidden-states", "decode-bench", "hisparse")

OFFLOAD_ON_GPU_ONLY = ("vLLM CPU 0.32 refuses it at start-up: 'CPU Offloading is currently only "
                       "supported on CUDA-alike and XPU GPUs'")
ONE_SERVER_TOPOLOGY = ("it offloads one server's KV to host memory and serves prefix hits from "
                       "there: a one-server topology (evict, reload, judged against a baseline "
                       "without offloading) the harness has no deployment for yet")

NOT_DRIVEN: dict[str, ConnectorRow] = {
    "offloading": ConnectorRow(
        "OffloadingConnector", f"{VLLM_V1}.offloading_connector:OffloadingConnector", ("cuda",),
        devices_why=OFFLOAD_ON_GPU_ONLY, not_driven=ONE_SERVER_TOPOLOGY),
    "simple-cpu-offload": ConnectorRow(
        "SimpleCPUOffloadConnector",
        f"{VLLM_V1}.simple_cpu_offload_connector:SimpleCPUOffloadConnector", ("cuda",),
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
    "example-hidden-states": ConnectorRow(
        "ExampleHiddenStatesConnector",
        f"{VLLM_V1}.example_hidden_states_connector:ExampleHiddenStatesConnector", ("cpu", "cuda"),
        moves_kv="it writes a request's hidden states to disk for speculative-decoding "
                 "draft training"),
    "decode-bench": ConnectorRow(
        "DecodeBenchConnector", f"{VLLM_V1}.decode_bench_connector:DecodeBenchConnector",
        ("cpu", "cuda"),
        moves_kv="it fills the decode's KV cache with dummy values to benchmark decoding "
                 "alone"),
    "hisparse": ConnectorRow(
        "HiSparseConnector", f"{VLLM_V1}.hisparse.connector:HiSparseConnector", ("cuda",),
        moves_kv="it pages one server's sparse-attention KV between its GPU and its own host "
                 "pool ('HiSparseConnector requires a HiSparse host pool')"),
}

__all__ = ["DEFAULT_KV_CONNECTOR", "LISTED", "NOT_DRIVEN", "OFFLOAD_ON_GPU_ONLY",
           "ONE_SERVER_TOPOLOGY"]
