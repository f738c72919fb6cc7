"""vLLM's NixlConnector in pull mode: the decode READs the prompt's KV blocks from the prefill
over NIXL (UCX underneath), the P/D default this harness was built on.

Servers: ``kv_transfer_config`` names NixlConnector; each P/D server gets NIXL's side channel
(``VLLM_NIXL_SIDE_CHANNEL_HOST``/``_PORT``, the handshake port; vLLM opens ``port + rank`` for each
TP rank, hence one reserved port per rank). Proxy: as vLLM's
``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``, prefill first with
``max_tokens=1`` and ``do_remote_decode``, then decode with the ``kv_transfer_params`` the prefill
answered (its engine, host, port and block ids). Evidence: the decode performs the READs, so its
``/metrics`` carry the ``vllm:nixl_*`` transfer counters, except the lease expirations, which the
prefill counts (it holds the leases); the bytes are the listed prefill blocks x the model's KV
geometry (harness.judge.byte_accounting).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.connectors.driver import KvConnector, LogPatterns, MetricMap, ServerPorts

SIDE_CHANNEL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"
SIDE_CHANNEL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"

# vLLM's NixlKVConnectorStats (vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py)
NIXL_SAMPLES = {
    "vllm:nixl_bytes_transferred_sum": "kv_bytes",
    "vllm:nixl_bytes_transferred_count": "kv_transfers",
    "vllm:nixl_num_failed_transfers_total": "failed_transfers",
    "vllm:nixl_num_failed_notifications_total": "failed_notifications",
    "vllm:nixl_num_kv_expired_reqs_total": "expired_requests",
}

# the decode counts its reads; the prefill, which holds each request's lease, its expirations
PULL_ROLES = {"expired_requests": "prefill"}
LEASE_KEY = "kv_lease_duration"     # vLLM reads an int (seconds)
NIXL_LOG = LogPatterns(
    # NIXL's own Python logger writes "NIXL" in its lines
    error_word=r"NIXL",
    # NIXL's optional expert-parallel extension, absent on an offline GPU host (docs/gpu.md)
    harmless=r"No module named 'nixl_ep|Module nixl_ep was found but failed to import",
    # a refused handshake is the cause of whatever the decode logs after it (vLLM 0.26 on the
    # H200 then raised "IndexError: list index out of range" per request)
    root_cause=r"NIXL compatibility hash mismatch",
    # vLLM 0.32 NixlBaseConnectorWorker._reap_expired_send_leases, once per expired request
    lease_expired=r"Releasing expired KV blocks for request (\S+)")

# What the prefill hop asks for: compute the prompt, keep its KV blocks for a remote decoder.
PREFILL_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


@dataclass(frozen=True)
class NixlConnector(KvConnector):
    """NIXL, pull: the decode reads."""

    def kv_transfer_config(self, role: str, *, kv_role: str, kv_buffer_device: str,
                           kv_layout: str = "default",
                           side_port: int | None = None) -> dict[str, Any]:
        config = super().kv_transfer_config(role, kv_role=kv_role,
                                            kv_buffer_device=kv_buffer_device)
        if role == "decode" and kv_layout == "NHD":
            # NIXL's own P/D layout is HND; an NHD decode refuses HND blocks at the handshake
            # ("expects same kv_cache_layout") unless told to permute them on receipt
            config["enable_permute_local_kv"] = True
        return config

    def server_env(self, *, host: str, side_host: str | None,
                   side_port: int | None) -> dict[str, str]:
        env = {SIDE_CHANNEL_HOST_ENV: side_host or host}
        if side_port is not None:
            env[SIDE_CHANNEL_PORT_ENV] = str(side_port)
        return env


CONNECTOR = NixlConnector(
    value="nixl", vllm_name="NixlConnector",
    metrics=MetricMap(NIXL_SAMPLES, role_of=PULL_ROLES), ports=ServerPorts(per_rank=1),
    prefill_params=PREFILL_PARAMS, byte_accounting="blocks", kv_digest=True,
    lease_key=LEASE_KEY, log=NIXL_LOG)

__all__ = ["CONNECTOR", "LEASE_KEY", "NIXL_LOG", "NIXL_SAMPLES", "PULL_ROLES", "NixlConnector", "PREFILL_PARAMS",
           "SIDE_CHANNEL_HOST_ENV", "SIDE_CHANNEL_PORT_ENV"]
