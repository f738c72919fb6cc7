"""vLLM's MultiConnector of NIXL (pull) and the OffloadingConnector: vLLM's own CI configuration
(``tests/v1/kv_connector/nixl_integration``: P/D through NIXL while each server also offloads
its KV to host memory); and the wrapper with NIXL as its only child (``multi-nixl``), on a
machine where the offloading child cannot run (vLLM CPU refuses it at start-up).

The P/D part is NIXL's, unchanged: the same side channel, proxy params (MultiConnector merges its
children's ``kv_transfer_params``; only NIXL's carry remote blocks), ``vllm:nixl_*`` counters
(MultiConnector exposes each child's Prometheus metrics under the child's own names) and byte
account. The offloading child is what differs: a transfer must still be exact and the KV
identical while the same blocks are also being copied to host memory. It runs on GPUs only
(vLLM CPU refuses the offloading child at start-up).

``multi-nixl`` judges MultiConnector's own part of a P/D request: its children's
``kv_transfer_params`` merged, their Prometheus metrics re-exposed under the child's names, its
request bookkeeping (which child loads, extra async saves). The transfer itself is NIXL's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.connectors.driver import MetricMap, ServerPorts
from harness.connectors.nixl.pull import (LEASE_KEY, NIXL_LOG, NIXL_SAMPLES, PREFILL_PARAMS,
                                           PULL_ROLES, NixlConnector)

# host memory each server's offloading child may use (its chunk: the server's own block size)
OFFLOAD_CPU_BYTES = 1 << 30


@dataclass(frozen=True)
class MultiNixlOffloadConnector(NixlConnector):
    """NIXL pull + offloading, through MultiConnector (``offload=False``: NIXL alone in it, what
    a CPU runs: the wrapper's own params merging, metrics and request bookkeeping)."""

    offload: bool = True

    def kv_transfer_config(self, role: str, *, kv_role: str, kv_buffer_device: str,
                           kv_layout: str = "default",
                           side_port: int | None = None) -> dict[str, Any]:
        nixl = NixlConnector.kv_transfer_config(self, role, kv_role=kv_role,
                                                kv_buffer_device=kv_buffer_device,
                                                kv_layout=kv_layout, side_port=side_port)
        nixl["kv_connector"] = "NixlConnector"
        offload = {"kv_connector": "OffloadingConnector", "kv_role": kv_role,
                   "kv_connector_extra_config": {"cpu_bytes_to_use": OFFLOAD_CPU_BYTES}}
        children = [nixl, offload] if self.offload else [nixl]
        return {"kv_connector": self.vllm_name, "kv_role": kv_role,
                "kv_buffer_device": kv_buffer_device,
                "kv_connector_extra_config": {"connectors": children}}


CONNECTOR = MultiNixlOffloadConnector(
    value="multi-nixl-offload", vllm_name="MultiConnector",
    metrics=MetricMap(NIXL_SAMPLES, role_of=PULL_ROLES), ports=ServerPorts(per_rank=1),
    prefill_params=PREFILL_PARAMS, byte_accounting="blocks", kv_digest=True,
    lease_key=LEASE_KEY, log=NIXL_LOG)

MULTI_NIXL = MultiNixlOffloadConnector(
    value="multi-nixl", vllm_name="MultiConnector",
    metrics=MetricMap(NIXL_SAMPLES, role_of=PULL_ROLES), ports=ServerPorts(per_rank=1),
    prefill_params=PREFILL_PARAMS, byte_accounting="blocks", kv_digest=True, offload=False,
    lease_key=LEASE_KEY, log=NIXL_LOG)

__all__ = ["CONNECTOR", "MULTI_NIXL", "MultiNixlOffloadConnector"]
