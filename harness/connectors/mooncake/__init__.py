"""vLLM's MooncakeConnector over the Mooncake Transfer Engine's TCP transport, found by
harness.connectors' scan of its packages: its row (below), its driver (``driver``), its hook
into vLLM (``HOOKS``) and its in-server part (``in_server``: Mooncake's statistics as
Prometheus counters)."""
from __future__ import annotations

from harness.connectors.facts import ConnectorRow
from harness.connectors.mooncake import driver
from harness.core.vllm_hooks import Hook, Need

ROWS: dict[str, ConnectorRow] = {
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
}
DRIVERS = (driver.CONNECTOR,)
HOOKS = (
    Hook("mooncake-counters",
         ("MooncakeConnector's transfer counters on /metrics",),
         needs=(Need("vllm.distributed.kv_transfer.kv_connector.v1.metrics",
                     "KVConnectorPromMetrics"),
                Need("vllm.v1.metrics.utils", "create_metric_per_engine")),
         what="Prometheus counters over Mooncake's own statistics"),
)
# which module of this package attaches each hook (doctor says where a hook lives)
HOOK_PLUGINS = {"mooncake-counters": "in_server"}

__all__ = ["DRIVERS", "HOOKS", "HOOK_PLUGINS", "ROWS"]
