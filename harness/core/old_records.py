"""Records and history stores written under older names, and the one translation to today's,
for every reader of old files: records (harness.run.record.upgrade_record, which the judge's
re-judging, the report and the history all read through) and the history store's migration
(harness.report.history).

- Schema 1, before the connector seam, when NIXL was the only connector: the harness named what
  it moved after it (``nixl_bytes``, the check ``nixl-bytes-exact``).
- Schema 2, before more than one weather sent a request series of its own after the first look
  (harness.run.weather.base.Sustain): the series was the soak's (``metrics.weather.soak``, each
  row's ``soak_index``, the check ``soak-trend``). Today it is the weather's series
  (``metrics.weather.series``, ``series_index``, ``agreement-trend``).
"""
from __future__ import annotations

from typing import Any, Mapping

# a record's metrics.transfer counters, schema 1 -> today's
COUNTER_NAMES = {"nixl_bytes": "kv_bytes", "nixl_transfers": "kv_transfers",
                 "nixl_failed_transfers": "failed_transfers",
                 "nixl_failed_notifications": "failed_notifications",
                 "nixl_expired_requests": "expired_requests"}
# a verdict's check names, schema 1 and 2 -> today's
CHECK_NAMES = {"nixl-bytes-exact": "kv-bytes-exact", "soak-trend": "agreement-trend"}
# a record's metrics.weather keys and each request row's keys, schema 2 -> today's
WEATHER_NAMES = {"soak": "series"}
ROW_NAMES = {"soak_index": "series_index"}
# the history store's cells columns, version 1 -> 2
HISTORY_COLUMNS = {"nixl_bytes": "kv_bytes"}


def counter_names(transfer: Mapping[str, object]) -> dict[str, object]:
    """`transfer` (a record's transfer dict) with counter names of schema 1 renamed."""
    return {COUNTER_NAMES.get(k, k): v for k, v in transfer.items()}


def _renamed(data: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    return {names.get(k, k): v for k, v in data.items()}


def with_todays_names(data: dict[str, Any]) -> dict[str, Any]:
    """A record of schema 1 or 2 (parsed JSON, changed in place) with today's names: its
    transfer counters, its weather's series and rows, its checks."""
    metrics = data.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("transfer"), dict):
        metrics["transfer"] = counter_names(metrics["transfer"])
    weather = metrics.get("weather") if isinstance(metrics, dict) else None
    if isinstance(weather, dict):
        metrics["weather"] = weather = _renamed(weather, WEATHER_NAMES)
        if isinstance(weather.get("rows"), list):
            weather["rows"] = [_renamed(r, ROW_NAMES) if isinstance(r, dict) else r
                               for r in weather["rows"]]
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
