"""vLLM's ExampleConnector: the teaching connector of vLLM's KV connector interface
(vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py, vLLM 0.32). The prefill saves
each new prompt's KV into files under ``shared_storage_path`` (one safetensors file per layer, in
a folder named by the hash of the prompt's tokens); the decode, asked the same prompt, finds the
folder and loads the KV from it instead of computing it.

Servers: both sides of a pair get the same fresh directory (``kv_connector_extra_config.
shared_storage_path``, made by the deployment: ``<logs>/<pair>.kv-files``), the prefill
``kv_producer``, the decode ``kv_consumer``. Proxy: no ``kv_transfer_params`` cross; the prefill
answers none and the decode needs none (it matches by prompt). Evidence: the connector has no
counters and its hops no params, so the checks built on them are not available (the record says
so); what proves the transfer is the decode's own count of prompt tokens of source
``external_kv_transfer`` and the KV digest of both sides
(harness.connectors.example.in_server: what the prefill saved, what the decode
loaded), joined per request by the proxy's id.

It loads whole blocks of the prompt less its last token (``align_to_block_size(len - 1)``): the
decode computes the last 2 to block_size + 1 prompt tokens itself on every request.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from harness.connectors.driver import KvConnector, MetricMap

SHARED_PATH_KEY = "shared_storage_path"
NO_PARAMS = "its hops carry no kv_transfer_params (the decode loads by the prompt's hash)"

NOT_AVAILABLE = {
    "prefill-returned-params": f"the prefill answers none: {NO_PARAMS}",
    "decode-got-params": f"the decode is sent none: {NO_PARAMS}",
    "decode-got-own-params": f"nothing to compare: {NO_PARAMS}; the KV digest joins each decode "
                             "to its own prefill by the proxy's request id",
    "no-failed-transfers": "ExampleConnector counts no transfers, failed or not (no /metrics of "
                           "its own); a failed load is an exception in the decode",
    "decode-did-not-recompute": "it loads the prompt's whole blocks short of its last "
                                "position, and the decode computes the remaining 2 to "
                                "block_size + 1 prompt tokens itself by design",
    "kv-bytes-exact": "it counts no bytes (no /metrics of its own)",
}


@dataclass(frozen=True)
class ExampleConnector(KvConnector):
    """KV through files on a path both servers share; no params, no counters."""

    def kv_transfer_config(self, role: str, *, kv_role: str, kv_buffer_device: str,
                           kv_layout: str = "default",
                           side_port: int | None = None) -> dict[str, Any]:
        # the shared path is added by the server spec (a per-pair directory)
        return {"kv_connector": self.vllm_name, "kv_role": kv_role}

    def prefill_answer(self, received: Mapping[str, Any] | None, *,
                       sent: Mapping[str, Any], side: str | None) -> Mapping[str, Any] | None:
        return None

    def decode_params(self, received: Mapping[str, Any] | None) -> dict[str, Any] | None:
        return None

    def block_params(self, received: Mapping[str, Any] | None,
                     sent: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        return None


CONNECTOR = ExampleConnector(
    value="example", vllm_name="ExampleConnector",
    metrics=MetricMap({}), byte_accounting=None, kv_digest=True,
    prefill_answers_params=False, shared_path_key=SHARED_PATH_KEY, not_available=NOT_AVAILABLE)

__all__ = ["CONNECTOR", "ExampleConnector", "NOT_AVAILABLE", "SHARED_PATH_KEY"]
