"""aborts: the harness proxy cancels a share of the requests, each at one of four phases
(its ``proxy``: queued on the prefill; prefill done, decode never sent; the decode
took it, before its first token; mid-decode), the way a client that goes away does (vllm
#41269, #46240, #46283, #50754: stranded blocks, a killed EngineCore). A short lease (the
connector's ``lease_key``) lets the prefill release the blocks of a decode that never came.

Must hold: every survivor answered with its prefill's KV (the verdict's silent wrong answers:
0); every cancelled request failed loudly (499, the phase named); afterwards, once the lease
ran out, neither server holds KV blocks (``vllm:kv_cache_usage_perc`` back to 0) and both
answer /health.
"""
from __future__ import annotations

from collections import Counter
from typing import Mapping

from harness.core.cell import Cell
from harness.weathers.facts import ServerChanges
from harness.judge.weather import InjectedEvent, WeatherCondition
from harness.run.weather.base import Weather, WeatherRun, Workload
from harness.run.weather.tagged import events_of, lease_key, share_tag, tagged_records
from harness.weathers.aborts.protocol import MIX, PHASES, request_tag

USAGE_SAMPLE = "vllm:kv_cache_usage_perc"
MARKER = "wx.abort."
SETTLE_AFTER_LEASE_S = 3.0   # the prefill reaps expired leases on its next step


class Aborts(Weather):
    name = "aborts"

    def servers(self, cell: Cell, params: Mapping[str, float]) -> dict[str, ServerChanges]:
        lease = ((lease_key(cell), int(params["lease_s"])),)
        return {"prefill": ServerChanges(kv_connector_extra=lease),
                "decode": ServerChanges(kv_connector_extra=lease)}

    def workload(self, cell: Cell, params: Mapping[str, float]) -> Workload:
        return Workload(request_tag=share_tag(request_tag(MIX), params["share"]))

    def settle_s(self, params: Mapping[str, float]) -> float:
        return params["lease_s"] + SETTLE_AFTER_LEASE_S

    def accounted_checks(self, params: Mapping[str, float]) -> dict[str, str]:
        why = ("cancelled reads moved (or failed to move) KV for no answer; each answered "
               "request's digest instead")
        return {"kv-bytes-exact": why, "no-failed-transfers": why}

    def events(self, run: WeatherRun) -> tuple[InjectedEvent, ...]:
        return events_of([r for r in tagged_records(run, MARKER) if r.get("abort_phase")],
                         "aborted", lambda r: f"cancelled by the proxy at {r['abort_phase']}")

    def conditions(self, run: WeatherRun) -> tuple[WeatherCondition, ...]:
        phases = Counter(r.get("abort_phase") for r in tagged_records(run, MARKER))
        seen = ", ".join(f"{p} {phases.get(p, 0)}" for p in PHASES)
        out = [WeatherCondition("happened", "phases", all(phases.get(p) for p in PHASES),
                                f"requests cancelled per phase: {seen}")]
        for server in sorted(run.metrics_after):
            usage = run.metrics_after[server].get(USAGE_SAMPLE)
            out.append(WeatherCondition(
                "holds", f"kv-idle[{server}]", usage == 0.0,
                f"{server} {USAGE_SAMPLE} {usage if usage is not None else '?'} "
                f"{self.settle_s(run.params):g} s after the last request (wanted 0)"))
        return tuple(out)


WEATHER = Aborts()
