"""The KV connectors a cell can name: the one table from a cell's ``kv_connector`` value to the
module that knows that connector (``harness.serve.connectors``) and the facts the matrix rules
check before any server starts (is vLLM's name registered, does the transport import, which
devices). Adding a connector is one row here and one module there.

It lives in core, not next to the connector modules, because the matrix validates cells before
anything of serve/ is imported (harness.matrix may only import core).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConnectorRow:
    module: str                  # harness.serve.connectors.<name>: defines CONNECTOR
    vllm_name: str               # the name vLLM's KVConnectorFactory registers it under
    transport: str               # "module:attribute" that must import for a transfer to run
    devices: tuple[str, ...]     # Cell.device values it moves KV for


DEFAULT_KV_CONNECTOR = "nixl"
KV_CONNECTORS: dict[str, ConnectorRow] = {
    # pull: the decode READs the prompt's blocks from the prefill (vLLM's P/D default)
    "nixl": ConnectorRow("harness.serve.connectors.nixl", "NixlConnector", "nixl._api:nixl_agent",
                         ("cpu", "cuda")),
    # push: the prefill WRITEs its blocks into blocks the decode allocated and registered
    "nixl-push": ConnectorRow("harness.serve.connectors.nixl_push", "NixlPushConnector",
                              "nixl._api:nixl_agent", ("cpu", "cuda")),
}


def connector_row(value: str) -> ConnectorRow:
    """The row of ``value``; KeyError names the known values."""
    try:
        return KV_CONNECTORS[value]
    except KeyError:
        raise KeyError(f"unknown kv_connector {value!r}; use one of {', '.join(KV_CONNECTORS)}") from None


__all__ = ["DEFAULT_KV_CONNECTOR", "KV_CONNECTORS", "ConnectorRow", "connector_row"]
