"""vLLM's offloading connectors, for :mod:`harness.serve.plugins.kv_events.interface`: they move a
server's KV between its own GPU and host memory, not between servers. Beside a P/D connector in a
MultiConnector (vLLM CI's configuration) their ``request_finished`` keeps a request's blocks
while it stores them, which the interface would report as a second send of the same request's
KV; so they are left unhooked until a one-server offload topology judges them on their own.
"""
from __future__ import annotations

CONNECTOR_CLASSES = ("OffloadingConnector", "SimpleCPUOffloadConnector")
UNHOOKED = "moves one server's KV to its host memory and back, not between servers"
