"""vLLM's NIXL connectors (pull, push, and MultiConnector around NIXL): their rows, drivers,
hooks into vLLM and in-server part, found by harness.connectors' scan of its packages.

- facts: ``ROWS`` below (what the matrix checks, what the weathers and verdict need);
- drivers: ``pull`` (vLLM's P/D default), ``push``, ``multi`` (``DRIVERS``);
- hooks into vLLM and NIXL: ``HOOKS`` below (the worker's read poll and send leases, attached
  by ``in_server/kv_events.py``; the binding's agent, by ``in_server/idle.py``);
- in the servers: ``in_server/`` (what NIXL does its own way at the connector interface: its
  read poll, its send leases; MultiConnector and its offloading child left unhooked; NIXL's idle
  progress thread, a vLLM general plugin of its own).
"""
from __future__ import annotations

from harness.connectors.facts import (DECODE_MULTIPLE, KV_DTYPE_MIX, KV_HEAD_MIX, KV_LAYERS_MIX,
                                      PERMUTE_HYBRID, ConnectorRow, Refusal)
from harness.connectors.nixl import multi, pull, push
from harness.connectors.nixl.variables import DELAY_ENV, parse_delay_us
from harness.connectors.vllm_registry import OFFLOAD_ON_GPU_ONLY
from harness.core.vllm_hooks import Hook, Need, any_of

NIXL_TRANSPORT = "nixl._api:nixl_agent"
# the weathers that drive a connector's own machinery (its lease, its read poll, its
# reconnection), measured with NIXL pull
NIXL_WEATHERS = ("expiry", "load-failures", "aborts", "restart")

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
    KV_HEAD_MIX: Refusal(
        how="vLLM hashes an EAGLE/MTP head (its method, model and KV dtype) into the NIXL "
            "compatibility hash, so the decode's handshake refuses a prefill without it ('NIXL "
            "compatibility hash mismatch') and every request errors (kv_load_failure_policy "
            "fail)",
        fails_with=_ALL_REQUESTS_FAILED + ".*NIXL compatibility hash mismatch"),
    PERMUTE_HYBRID: Refusal(
        how="an NHD decode permutes the HND blocks it receives (enable_permute_local_kv), and "
            "NIXL asserts 'HMA does not support block size post processing' for a hybrid model "
            "(its Mamba/GDN groups need the hybrid KV cache manager)"),
}
# NIXL 1.5.1 serves every vLLM release here; installed without its dependencies (its
# torch pin would replace the release's)
NIXL_PINS = ("nixl==1.5.1", "nixl-cu12==1.5.1")
NIXL_FACTS = dict(label="NIXL", block_sizes=DECODE_MULTIPLE, block_sizes_why=NIXL_BLOCKS_WHY,
                  refusals=NIXL_REFUSALS, kv_layout="HND", distributions=NIXL_DISTRIBUTIONS,
                  release_pins=NIXL_PINS)

ROWS: dict[str, ConnectorRow] = {
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
}
DRIVERS = (pull.CONNECTOR, push.CONNECTOR, multi.MULTI_NIXL, multi.CONNECTOR)

NIXL_WORKER = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"
WORKER = "NixlBaseConnectorWorker"

HOOKS = (
    Hook("nixl-read-poll",
         ("canary fail-transfer", "weather load-failures", "digest as written (before post-processing)"),
         needs=(Need(NIXL_WORKER, f"{WORKER}._pop_done_transfers", ("transfers",)),
                # 0.30 on: the failed set too; 0.27-0.29: (req_id, handle), failures queued
                any_of(Need(NIXL_WORKER, f"{WORKER}._handle_failed_transfer",
                            ("req_id", "handle", "failed_req_ids")),
                       Need(NIXL_WORKER, f"{WORKER}._handle_failed_transfer",
                            ("req_id", "handle")))),
         requires=("kv-events",), canaries=("fail-transfer",), weathers=("load-failures",),
         what="the NIXL worker's read poll: bytes in place, not yet post-processed"),
    Hook("nixl-leases",
         ("canary early-release",),
         # 0.31 on: a reaper of its own; before: get_finished checks the leases inline
         needs=(any_of(Need(NIXL_WORKER, f"{WORKER}._reap_expired_send_leases"),
                       Need(NIXL_WORKER, f"{WORKER}.get_finished")),),
         canaries=("early-release",),
         what="shortens the prefill's send leases before each step's lease check"),
    Hook("nixl-idle",
         ("NIXL's progress thread sleeps while idle (CPU time)",),
         needs=(any_of(Need("nixl_cu12._api", "nixlBind.nixlAgent"),
                       Need("nixl_cu13._api", "nixlBind.nixlAgent")),),
         what="raises NIXL's progress-thread delay from 0"),
)
# which module of this package attaches each hook (doctor says where a hook lives)
HOOK_PLUGINS = {"nixl-read-poll": "in_server.kv_events", "nixl-leases": "in_server.kv_events",
                "nixl-idle": "in_server.idle"}

__all__ = ["DRIVERS", "HOOKS", "HOOK_PLUGINS", "NIXL_DISTRIBUTIONS", "NIXL_FACTS", "NIXL_PINS",
           "NIXL_REFUSALS", "NIXL_TRANSPORT", "NIXL_WEATHERS", "NIXL_WORKER", "ROWS", "WORKER"]

# the PD_ACCURACY_* variables its in-server part reads, with the parse it uses there
SERVER_VARIABLES = {DELAY_ENV: parse_delay_us}
