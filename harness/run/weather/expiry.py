"""expiry: a short KV lease on the prefill (``kv_lease_duration``) and, for a share of the
requests, the decode's read started after it ran out (the decode's late-read fault,
harness.serve.plugins.faults.late_read: the request is held from its connector and sends no
lease-renewal heartbeats). The prefill then releases the request's blocks; a read that still
comes must end in an error or a right answer, never a wrong HTTP 200 (aws-samples/aws-do-eks
#84: 8 of 42 requests served from released blocks, all 200; vllm #58222, #50789).

Holds: the prefill's expired count (``vllm:nixl_num_kv_expired_reqs``) equals the delayed
requests that reached the decode; each delayed request's read was held (a decode log line).
"""
from __future__ import annotations

from typing import Mapping

from harness.core.cell import Cell
from harness.core.weathers import ServerChanges
from harness.judge.weather import InjectedEvent, WeatherCondition
from harness.run.weather.base import Weather, WeatherRun, Workload
from harness.run.weather.tagged import (SERVER_FAULT_ENV, counted, decode_log, events_of,
                                        share_tag, tagged_records)
from harness.serve.plugins.faults.late_read import parse_late_read_log, request_tag

EXPIRED_SAMPLE = "vllm:nixl_num_kv_expired_reqs_total"
LATE_BY_S = 2.0          # the read starts this long after the lease ran out
MARKER = "wx.late-read."


def delay_ms(params: Mapping[str, float]) -> int:
    return int((params["lease_s"] + LATE_BY_S) * 1000)


class Expiry(Weather):
    name = "expiry"

    def servers(self, cell: Cell, params: Mapping[str, float]) -> dict[str, ServerChanges]:
        lease = (("kv_lease_duration", int(params["lease_s"])),)   # vLLM reads an int
        return {"prefill": ServerChanges(kv_connector_extra=lease),
                "decode": ServerChanges(kv_connector_extra=lease, extra_env=SERVER_FAULT_ENV)}

    def workload(self, cell: Cell, params: Mapping[str, float]) -> Workload:
        return Workload(request_tag=share_tag(request_tag(delay_ms(params)), params["share"]))

    def events(self, run: WeatherRun) -> tuple[InjectedEvent, ...]:
        late = delay_ms(run.params)
        return events_of(tagged_records(run, MARKER), "read-after-lease",
                         lambda r: f"decode read held {late} ms, lease {run.params['lease_s']:g} s")

    def conditions(self, run: WeatherRun) -> tuple[WeatherCondition, ...]:
        reached = [r for r in tagged_records(run, MARKER) if r.get("decode_status") is not None]
        held = {line.request_id for line in parse_late_read_log(decode_log(run))
                if line.event == "held"}
        ours = sum(any(str(r["request_id"]) in h for h in held) for r in reached)
        expired = int(run.metric_delta_role("prefill", EXPIRED_SAMPLE))
        return (counted("reads-held", "happened", ours, len(reached),
                        "delayed requests whose read the decode held (late-read log lines)"),
                counted("expired-count", "holds", expired, len(reached),
                        f"prefill {EXPIRED_SAMPLE} growth against the delayed requests"))


WEATHER = Expiry()
