"""vLLM's NixlPushConnector: the prefill WRITEs the prompt's KV into blocks the decode allocated
first (vllm/distributed/kv_transfer/kv_connector/v1/nixl/push_scheduler.py, vLLM 0.32).

Requests travel differently through the proxy, as in vLLM's
``tests/v1/kv_connector/nixl_integration/toy_push_proxy_server.py``: the prefill hop is the pull
one, but the decode is sent only the prefill's coordinates (engine, request id, side-channel
host/port, TP size) with ``do_remote_prefill`` and *no* block ids; it allocates its blocks,
registers them with the prefill over a NIXL notification, and the prefill writes into them.
The writer counts the transfer, so the byte counters are on the prefill's ``/metrics`` (and the
lease expirations); a failed write is the prefill's failed transfer, a failed arrival (the
decode's poll reporting a request's KV did not land, what the fail-transfer fault injects)
the decode's, so that counter is read from both. A failed
registration is the decode's. The bytes are still the prefill's listed blocks (what it answered)
x the KV geometry.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from harness.connectors.driver import MetricMap, ServerPorts
from harness.connectors.nixl.pull import (LEASE_KEY, NIXL_LOG, NIXL_SAMPLES, PREFILL_PARAMS,
                                           NixlConnector)

# the prefill answer's keys the decode gets (toy_push_proxy_server.py): no remote_block_ids
DECODE_KEYS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port", "tp_size")


@dataclass(frozen=True)
class NixlPushConnector(NixlConnector):
    """NIXL, push: the prefill writes into the decode's registered blocks."""

    def decode_params(self, received: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if not received:
            return None
        return {"do_remote_prefill": True, "do_remote_decode": False,
                **{k: received.get(k) for k in DECODE_KEYS}}

    def block_params(self, received: Mapping[str, Any] | None,
                     sent: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        # the decode is never told the blocks: the prefill's answer lists what it writes, for
        # every request whose decode hop asked for a push
        return received if sent else None


CONNECTOR = NixlPushConnector(
    value="nixl-push", vllm_name="NixlPushConnector",
    metrics=MetricMap(NIXL_SAMPLES, role_of={"kv_bytes": "prefill", "kv_transfers": "prefill",
                                             "failed_transfers": ("prefill", "decode"),
                                             "expired_requests": "prefill"}),
    # the digest plugin listens on vLLM's connector interface: any connector class
    ports=ServerPorts(per_rank=1), prefill_params=PREFILL_PARAMS, byte_accounting="blocks",
    kv_digest=True, lease_key=LEASE_KEY, log=NIXL_LOG)

__all__ = ["CONNECTOR", "NixlPushConnector"]
