"""expiry: a short KV lease on the prefill (the connector's ``lease_key``) and, for a share of the
requests, the decode's read started after it ran out (the decode's late-read fault, this
package's ``in_server``, its tag and lines its ``protocol``: the request is held from its
connector and sends no lease-renewal heartbeats). The prefill then
releases the request's blocks; a read that still comes must end in an error or a right answer,
never a wrong HTTP 200 (aws-samples/aws-do-eks #84: 8 of 42 requests served from released
blocks, all 200; vllm #58222, #50789).

Holds: every delayed request that reached the decode expired on the prefill (its log names
each request whose blocks it released: the connector's ``LogPatterns.lease_expired``), and the
connector's ``expired_requests`` counter grew by the number its log names. A
lease this short also runs out for some requests that were not delayed, whose decode hop was
still on its way when it ended (measured on 2 busy cores: 12 of 39): those are events too.
"""
from __future__ import annotations

import re
from typing import Mapping

from harness.core.cell import Cell
from harness.weathers.facts import ServerChanges
from harness.judge.weather import InjectedEvent, WeatherCondition
from harness.run.weather.base import Weather, WeatherRun, Workload
from harness.run.weather.tagged import (SERVER_FAULT_ENV, counted, decode_log, events_of,
                                        lease_key, share_tag, tagged_records)
from harness.weathers.expiry.protocol import parse_late_read_log, request_tag

LATE_BY_S = 2.0          # the read starts this long after the lease ran out
MARKER = "wx.late-read."


def delay_ms(params: Mapping[str, float]) -> int:
    return int((params["lease_s"] + LATE_BY_S) * 1000)


class Expiry(Weather):
    name = "expiry"

    def servers(self, cell: Cell, params: Mapping[str, float]) -> dict[str, ServerChanges]:
        lease = ((lease_key(cell), int(params["lease_s"])),)
        return {"prefill": ServerChanges(kv_connector_extra=lease),
                "decode": ServerChanges(kv_connector_extra=lease, extra_env=SERVER_FAULT_ENV)}

    def workload(self, cell: Cell, params: Mapping[str, float]) -> Workload:
        return Workload(request_tag=share_tag(request_tag(delay_ms(params)), params["share"]))

    def events(self, run: WeatherRun) -> tuple[InjectedEvent, ...]:
        late = delay_ms(run.params)
        delayed = tagged_records(run, MARKER)
        named = {str(r.get("request_id")) for r in delayed}
        lapsed = [r for r in run.proxy_records if str(r.get("request_id")) not in named
                  and named_in(r, expired_ids(run))]
        return (events_of(delayed, "read-after-lease",
                          lambda r: f"decode read held {late} ms, lease {run.params['lease_s']:g} s")
                + events_of(lapsed, "lease-expired",
                            lambda r: "the prefill released it before the decode read (not delayed)"))

    def conditions(self, run: WeatherRun) -> tuple[WeatherCondition, ...]:
        reached = [r for r in tagged_records(run, MARKER) if r.get("decode_status") is not None]
        held = {line.request_id for line in parse_late_read_log(decode_log(run))
                if line.event == "held"}
        ours = sum(named_in(r, held) for r in reached)
        expired = expired_ids(run)
        counted_expired = int(run.counter_delta("expired_requests"))
        return (counted("reads-held", "happened", ours, len(reached),
                        "delayed requests whose read the decode held (late-read log lines)"),
                counted("delayed-expired", "holds", sum(named_in(r, expired) for r in reached),
                        len(reached), "delayed requests the prefill released as expired (its log)"),
                counted("expired-count", "holds", counted_expired, len(expired),
                        f"{run.counter_source('expired_requests')} growth against the requests "
                        f"its log released as expired ({len(expired) - len(reached)} of them not "
                        "delayed)"))


def expired_ids(run: WeatherRun) -> set[str]:
    """The prefill's request ids its log says it released as expired."""
    pattern = run.connector.log.lease_expired
    if pattern is None:
        return set()
    text = "\n".join(run.log_text(n) for n in sorted(run.logs) if n.startswith("prefill"))
    return set(re.findall(pattern, text))


def named_in(record: dict, engine_ids: set[str]) -> bool:
    """Whether the proxy's request is among vLLM's ids (which carry the proxy's X-Request-Id)."""
    proxy_id = str(record.get("request_id") or "")
    return bool(proxy_id) and any(proxy_id in engine_id for engine_id in engine_ids)


WEATHER = Expiry()
