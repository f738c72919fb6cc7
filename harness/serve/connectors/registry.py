"""A cell's ``kv_connector`` value -> its :class:`~harness.serve.connectors.base.KvConnector`,
through the one table in ``harness.core.kv_connectors`` (imported on first use)."""
from __future__ import annotations

import importlib
from functools import lru_cache

from harness.core.kv_connectors import DEFAULT_KV_CONNECTOR, connector_row, driven_connectors
from harness.serve.connectors.base import KvConnector, LogPatterns


@lru_cache(maxsize=None)
def connector_for(value: str = DEFAULT_KV_CONNECTOR) -> KvConnector:
    """The connector of ``value`` (KeyError: unknown value, naming the known ones, or one the
    harness does not drive, saying why)."""
    row = connector_row(value)
    if row.module is None:
        raise KeyError(f"kv_connector {value!r} ({row.vllm_name}) is not driven by the harness: "
                       f"{row.not_driven}")
    connector = importlib.import_module(row.module).CONNECTOR
    if not isinstance(connector, KvConnector) or connector.value != value:
        raise TypeError(f"{row.module}.CONNECTOR is not the {value!r} KvConnector")
    return connector


@lru_cache(maxsize=None)
def log_patterns(kind: str) -> str | None:
    """One regex of every driven connector's ``LogPatterns.<kind>`` (None: none has one): a
    server log is read before anyone asks which connector wrote it."""
    found = {getattr(connector_for(v).log, kind) for v in driven_connectors()} - {None}
    return "|".join(f"(?:{p})" for p in sorted(found)) or None


__all__ = ["connector_for", "log_patterns"]
