"""Schema 1: records and history stores written before the connector seam, when NIXL was the
only connector and the harness named what it moved after it (``nixl_bytes``, the check
``nixl-bytes-exact``). The one translation to today's names, for every reader of old files:
records (harness.run.record.upgrade_record) and the history store's migration
(harness.report.history)."""
from __future__ import annotations

from typing import Any, Mapping

# a record's metrics.transfer counters, schema 1 -> today's
COUNTER_NAMES = {"nixl_bytes": "kv_bytes", "nixl_transfers": "kv_transfers",
                 "nixl_failed_transfers": "failed_transfers",
                 "nixl_failed_notifications": "failed_notifications",
                 "nixl_expired_requests": "expired_requests"}
# a verdict's check names, schema 1 -> today's
CHECK_NAMES = {"nixl-bytes-exact": "kv-bytes-exact"}
# the history store's cells columns, version 1 -> 2
HISTORY_COLUMNS = {"nixl_bytes": "kv_bytes"}


def counter_names(transfer: Mapping[str, object]) -> dict[str, object]:
    """`transfer` (a record's transfer dict) with counter names of schema 1 renamed."""
    return {COUNTER_NAMES.get(k, k): v for k, v in transfer.items()}


def with_todays_names(data: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 record (parsed JSON, changed in place) with today's counter and check names."""
    metrics = data.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("transfer"), dict):
        metrics["transfer"] = counter_names(metrics["transfer"])
    verdict = data.get("verdict")
    for check in (verdict.get("checks") or []) if isinstance(verdict, dict) else []:
        if isinstance(check, dict) and check.get("name") in CHECK_NAMES:
            check["name"] = CHECK_NAMES[check["name"]]
    if isinstance(verdict, dict) and verdict.get("check") in CHECK_NAMES:
        verdict["check"] = CHECK_NAMES[verdict["check"]]
    return data


def history_migration() -> tuple[str, ...]:
    """The statements that bring a version-1 history store's cells table to version 2."""
    return tuple(f"ALTER TABLE cells RENAME COLUMN {old} TO {new}"
                 for old, new in HISTORY_COLUMNS.items())
