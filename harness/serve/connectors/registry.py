"""A cell's ``kv_connector`` value -> its :class:`~harness.serve.connectors.base.KvConnector`.

Each connector module defines one ``CONNECTOR``, registered here under its value, which is a
``driven`` row of the one table in ``harness.core.kv_connectors``."""
from __future__ import annotations

from functools import lru_cache

from harness.core.kv_connectors import DEFAULT_KV_CONNECTOR, connector_row, driven_connectors
from harness.serve.connectors import (example, mooncake, multi_nixl, multi_nixl_offload, nixl,
                                      nixl_push)
from harness.serve.connectors.base import KvConnector, LogPatterns

# every connector the harness drives, by its kv_connector value
CONNECTORS: dict[str, KvConnector] = {module.CONNECTOR.value: module.CONNECTOR for module in (
    nixl, nixl_push, multi_nixl, multi_nixl_offload, mooncake, example)}


def connector_for(value: str = DEFAULT_KV_CONNECTOR) -> KvConnector:
    """The connector of ``value`` (KeyError: unknown value, naming the known ones, or one the
    harness does not drive, saying why)."""
    row = connector_row(value)
    if not row.driven:
        raise KeyError(f"kv_connector {value!r} ({row.vllm_name}) is not driven by the harness: "
                       f"{row.not_driven}")
    if value not in CONNECTORS:
        raise KeyError(f"kv_connector {value!r} is driven, but no module of "
                       f"harness.serve.connectors registers it")
    return CONNECTORS[value]


@lru_cache(maxsize=None)
def log_patterns(kind: str) -> str | None:
    """One regex of every driven connector's ``LogPatterns.<kind>`` (None: none has one): a
    server log is read before anyone asks which connector wrote it."""
    found = {getattr(connector_for(v).log, kind) for v in driven_connectors()} - {None}
    return "|".join(f"(?:{p})" for p in sorted(found)) or None


__all__ = ["CONNECTORS", "connector_for", "log_patterns"]
