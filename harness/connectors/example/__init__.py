"""vLLM's ExampleConnector (KV through files on a path both servers share), found by
harness.connectors' scan of its packages: its row (below), its driver (``driver``) and its
in-server part (``in_server``: when it saves and loads inside the step's forward)."""
from __future__ import annotations

from harness.connectors.example import driver
from harness.connectors.facts import VLLM_V1, ConnectorRow

ROWS: dict[str, ConnectorRow] = {
    "example": ConnectorRow(
        "ExampleConnector", f"{VLLM_V1}.example_connector:ExampleConnector", ("cpu", "cuda"),
        driven=True, label="ExampleConnector (files)",
        no_params="the decode finds the prompt's KV by the hash of its tokens in the shared "
                  "directory; no kv_transfer_params cross"),
}
DRIVERS = (driver.CONNECTOR,)

__all__ = ["DRIVERS", "ROWS"]
