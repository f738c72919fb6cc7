"""vLLM's MultiConnector, for :mod:`harness.serve.plugins.kv_events.interface`: a wrapper whose
children do the work. It resolves each child through ``KVConnectorFactory.get_connector_class``,
so every child class is patched at the interface already, and the wrapper delegates every
interface call to them; patching the wrapper as well would report each request's KV twice (its
own call and its child's), with two views of the same caches. So the wrapper is left alone.
"""
from __future__ import annotations

CONNECTOR_CLASSES = ("MultiConnector",)
# why the interface patches none of the class's methods
UNHOOKED = "a wrapper: its children are patched when it resolves them through the factory"
