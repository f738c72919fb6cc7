"""What the weathers that inject faults share: the requests the proxy tagged for an injection
are the events, read from its records; a server log line per injection proves the server acted
on each; the connector's lease setting, which they shorten.
"""
from __future__ import annotations

from typing import Callable, Iterable

from harness.connectors import connector_for
from harness.core.cell import Cell
from harness.judge.weather import InjectedEvent, WeatherCondition
from harness.run.weather.base import WeatherRun

SERVER_FAULT_ENV = (("PD_ACCURACY_FAULT", "by-request"),)   # the decode's faults plugin, armed


def share_tag(tag: str, share: float) -> str:
    """The proxy's request tag for ``tag`` on ``share`` of the questions (all when 1)."""
    return tag if share >= 1 else f"{tag}@{share:g}"


def tagged_records(run: WeatherRun, marker: str) -> list[dict]:
    """The proxy's records whose request id carries ``marker`` (the weather's tag)."""
    return [r for r in run.proxy_records if marker in str(r.get("request_id") or "")]


def events_of(records: Iterable[dict], kind: str, detail: Callable[[dict], str],
              may_fail: bool = True, recomputed: bool = False) -> tuple[InjectedEvent, ...]:
    return tuple(InjectedEvent(kind, r.get("request_id"), detail(r), may_fail, recomputed)
                 for r in records)


def decode_log(run: WeatherRun) -> str:
    """Every decode server's log (a restarted one's too), one text."""
    return "\n".join(run.log_text(name) for name in sorted(run.logs) if name.startswith("decode"))


def counted(name: str, kind: str, seen: int, wanted: int, what: str) -> WeatherCondition:
    """A condition that ``seen`` equals ``wanted`` (and, for "happened", that it is not 0)."""
    passed = seen == wanted and (kind != "happened" or wanted > 0)
    return WeatherCondition(kind, name, passed, f"{what}: {seen}, wanted {wanted}")


def lease_key(cell: Cell) -> str:
    """The cell's connector's lease setting (the matrix runs these weathers only with connectors
    whose row lists them; one without a lease cannot get here)."""
    key = connector_for(cell.kv_connector).lease_key
    if key is None:
        raise ValueError(f"kv_connector {cell.kv_connector} has no KV lease to shorten")
    return key


__all__ = ["SERVER_FAULT_ENV", "counted", "decode_log", "events_of", "lease_key", "share_tag",
           "tagged_records"]
