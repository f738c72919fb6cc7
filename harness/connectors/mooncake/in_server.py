"""What vLLM's MooncakeConnector does its own way, for :mod:`harness.serve.plugins.kv_events.interface`.

* ``extend``: vLLM 0.32 collects Mooncake's transfer statistics (``MooncakeKVConnectorStats``:
  bytes and duration per write, failed writes, failed reads, expired requests) but exposes them
  nowhere but a log line (its stats.py: "add MooncakePromMetrics ... in a follow-up PR"). The
  harness gives the class the ``build_prom_metrics`` it lacks, as counters over the connector's
  own statistics (``vllm:mooncake_*_total``), so the transfer proof reads Mooncake's own counts
  from /metrics like any other connector's (harness.connectors.mooncake.driver maps them). A vLLM that has its own
  keeps it.
* The interface's arguments serve the rest: the prefill's ``request_finished`` keeps the blocks
  (``delay=True``, no params), the decode's receiving blocks come through
  ``update_state_after_alloc``, ``get_finished`` reports them in place.
"""
from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("vllm.pd_accuracy.kv_events")

CONNECTOR_CLASSES = ("MooncakeConnector",)
# each P/D server's own bootstrap port (harness.connectors.mooncake.driver)
PER_SERVER_ENV = ("VLLM_MOONCAKE_BOOTSTRAP_PORT",)
# statistics key -> counter name (Prometheus appends _total); a key counted by its list's length
# or, for bytes, by its sum
COUNTERS = {
    "bytes_transferred": ("vllm:mooncake_bytes_transferred", "Bytes Mooncake wrote", "sum"),
    "transfer_duration": ("vllm:mooncake_transfers", "Successful Mooncake writes", "count"),
    "num_failed_transfers": ("vllm:mooncake_num_failed_transfers", "Failed Mooncake writes",
                             "count"),
    "num_failed_recvs": ("vllm:mooncake_num_failed_recvs", "Failed Mooncake reads (decode)",
                         "count"),
    "num_kv_expired_reqs": ("vllm:mooncake_num_kv_expired_reqs",
                            "Requests whose KV expired before the decode pulled it", "count"),
}


def _prom_metrics_class() -> type:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics
    from vllm.v1.metrics.utils import create_metric_per_engine

    class MooncakePromMetrics(KVConnectorPromMetrics):
        def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
            super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
            self.pd_accuracy_counters = {
                key: (create_metric_per_engine(self._counter_cls(
                    name=name, documentation=doc, labelnames=labelnames),
                    self.per_engine_labelvalues), how)
                for key, (name, doc, how) in COUNTERS.items()}

        def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
            for key, (per_engine, how) in self.pd_accuracy_counters.items():
                values = transfer_stats_data.get(key) or []
                amount = sum(values) if how == "sum" else len(values)
                if amount:
                    per_engine[engine_idx].inc(amount)

    return MooncakePromMetrics


def extend(connector_cls: Any) -> None:
    """Give ``connector_cls`` Prometheus counters over its own statistics, unless it has some."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    from harness.serve.plugins import compat

    if not compat.attach("mooncake-counters"):
        return
    own = getattr(connector_cls, "build_prom_metrics", None)
    if own is None or getattr(own, "__func__", None) is not getattr(
            KVConnectorBase_V1.build_prom_metrics, "__func__", None):
        return
    metrics_class = _prom_metrics_class()

    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return metrics_class(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    connector_cls.build_prom_metrics = classmethod(build_prom_metrics)
    logger.info("pd-accuracy kv-events: Mooncake statistics exposed as vllm:mooncake_* counters")
