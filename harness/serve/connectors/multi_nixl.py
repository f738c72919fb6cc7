"""vLLM's MultiConnector with NIXL (pull) as its only child: the wrapper alone, on a machine where
its CI configuration's offloading child cannot run (vLLM CPU refuses the OffloadingConnector at
start-up; harness.serve.connectors.multi_nixl_offload is the full configuration, for GPUs).

What it judges is MultiConnector's own part of a P/D request: its children's
``kv_transfer_params`` merged, their Prometheus metrics re-exposed under the child's names, its
request bookkeeping (which child loads, extra async saves). The transfer itself is NIXL's.
"""
from __future__ import annotations

from harness.serve.connectors.base import MetricMap, ServerPorts
from harness.serve.connectors.multi_nixl_offload import MultiNixlOffloadConnector
from harness.serve.connectors.nixl import (LEASE_KEY, NIXL_LOG, NIXL_SAMPLES, PREFILL_PARAMS,
                                           PULL_ROLES)

CONNECTOR = MultiNixlOffloadConnector(
    value="multi-nixl", vllm_name="MultiConnector",
    metrics=MetricMap(NIXL_SAMPLES, role_of=PULL_ROLES), ports=ServerPorts(per_rank=1),
    prefill_params=PREFILL_PARAMS, byte_accounting="blocks", kv_digest=True, offload=False,
    lease_key=LEASE_KEY, log=NIXL_LOG)

__all__ = ["CONNECTOR"]
