"""What NIXL's in-server part needs from vLLM and from NIXL (rows of the compatibility table,
harness.core.vllm_hooks): the worker's read poll and send leases (``in_server/kv_events.py``) and
the binding's agent (``in_server/idle.py``)."""
from __future__ import annotations

from harness.core.vllm_hooks import Hook, Need, any_of

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

__all__ = ["HOOKS", "HOOK_PLUGINS", "NIXL_WORKER", "WORKER"]
