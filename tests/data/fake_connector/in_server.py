"""What the made-up connector does its own way at vLLM's connector interface (in the servers)."""
from __future__ import annotations

CONNECTOR_CLASSES = ("MadeUpConnector",)
PER_SERVER_ENV = ("MADE_UP_SIDE_PORT",)
