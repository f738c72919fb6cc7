"""vLLM's MooncakeConnector over the Mooncake Transfer Engine's TCP transport (one host, no RDMA):
the decode asks the prefill for a transfer it names, and the prefill WRITEs the prompt's blocks
into the decode's (vllm/distributed/kv_transfer/kv_connector/v1/mooncake, vLLM 0.32).

The proxy names each transfer, as vLLM's Mooncake proxy does: the prefill hop carries
``do_remote_decode`` and a ``transfer_id``; the prefill answers *no* params (its
``request_finished`` keeps the blocks and returns None), so the decode hop's params are what the
proxy knows: the same ``transfer_id``, the prefill's engine id and its bootstrap server's address
(``http://host:port/query`` lists the prefill's workers). The harness fixes both per prefill: the
bootstrap port is the server's reserved side port (``VLLM_MOONCAKE_BOOTSTRAP_PORT``) and the
engine id is derived from it, so the proxy needs only each prefill's side channel.

Evidence: vLLM 0.32 gives Mooncake's transfer statistics no Prometheus metrics (its stats.py:
"add MooncakePromMetrics ... in a follow-up PR"); the harness's kv-events plugin exposes the
connector's own statistics object as ``vllm:mooncake_*`` counters
(harness.connectors.mooncake.in_server). The writer counts: bytes, transfers and
failed writes on the prefill, failed reads on the decode. The params list no blocks, so the
judge cannot hold it to an exact byte count.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from harness.connectors.driver import KvConnector, MetricMap, ServerPorts

BOOTSTRAP_PORT_ENV = "VLLM_MOONCAKE_BOOTSTRAP_PORT"
ENGINE_ID_PREFIX = "pdacc-mooncake-"
TRANSFER_ID_PREFIX = "xfer-"

# harness.connectors.mooncake.in_server exposes these (Prometheus adds _total)
MOONCAKE_SAMPLES = {
    "vllm:mooncake_bytes_transferred_total": "kv_bytes",
    "vllm:mooncake_transfers_total": "kv_transfers",
    "vllm:mooncake_num_failed_transfers_total": "failed_transfers",
    "vllm:mooncake_num_failed_recvs_total": "failed_notifications",
    "vllm:mooncake_num_kv_expired_reqs_total": "expired_requests",
}


def engine_id(side_port: int | str) -> str:
    """The engine id the harness gives the prefill whose bootstrap server is on ``side_port``."""
    return f"{ENGINE_ID_PREFIX}{side_port}"


@dataclass(frozen=True)
class MooncakeConnector(KvConnector):
    """Mooncake over TCP: the proxy names the transfer, the prefill writes."""

    protocol: str = "tcp"

    def kv_transfer_config(self, role: str, *, kv_role: str, kv_buffer_device: str,
                           kv_layout: str = "default",
                           side_port: int | None = None) -> dict[str, Any]:
        config = super().kv_transfer_config(role, kv_role=kv_role,
                                            kv_buffer_device=kv_buffer_device)
        config["kv_connector_extra_config"] = {"mooncake_protocol": self.protocol}
        if role == "prefill" and side_port is not None:
            config["engine_id"] = engine_id(side_port)
        return config

    def server_env(self, *, host: str, side_host: str | None,
                   side_port: int | None) -> dict[str, str]:
        # every P/D server would otherwise bind the same default bootstrap port (8998)
        return {} if side_port is None else {BOOTSTRAP_PORT_ENV: str(side_port)}

    def prefill_params_for(self, request_id: str) -> dict[str, Any]:
        return {"do_remote_decode": True, "do_remote_prefill": False,
                "transfer_id": f"{TRANSFER_ID_PREFIX}{request_id}"}

    def prefill_answer(self, received: Mapping[str, Any] | None, *,
                       sent: Mapping[str, Any], side: str | None) -> Mapping[str, Any] | None:
        if received or not side or not sent.get("transfer_id"):
            return received
        _host, _, port = side.rpartition(":")
        return {"transfer_id": sent["transfer_id"], "remote_engine_id": engine_id(port),
                "remote_bootstrap_addr": f"http://{side}"}

    def decode_params(self, received: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if not received:
            return None
        return {"do_remote_prefill": True, "do_remote_decode": False,
                **{k: received.get(k) for k in
                   ("transfer_id", "remote_engine_id", "remote_bootstrap_addr")}}

    def block_params(self, received: Mapping[str, Any] | None,
                     sent: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        return None


CONNECTOR = MooncakeConnector(
    value="mooncake", vllm_name="MooncakeConnector",
    metrics=MetricMap(MOONCAKE_SAMPLES, role_of={"kv_bytes": "prefill", "kv_transfers": "prefill",
                                                 "failed_transfers": "prefill",
                                                 "expired_requests": "prefill"}),
    ports=ServerPorts(per_rank=1), byte_accounting=None, kv_digest=True,
    prefill_answers_params=False)

__all__ = ["BOOTSTRAP_PORT_ENV", "CONNECTOR", "MOONCAKE_SAMPLES", "MooncakeConnector",
           "engine_id"]
