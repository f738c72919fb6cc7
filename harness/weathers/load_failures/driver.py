"""load-failures: the decode's read of a share of the requests fails (the fail-transfer fault of
harness.serve.plugins.faults.fail_transfer, on the tagged requests only: the KV arrived, the
connector reports the read failed, and vLLM's own failure path runs), under the decode's
``kv_load_failure_policy``:

* ``fail`` (recompute 0, vLLM's default): exactly those requests fail loudly (finish reason
  ``error``, HTTP 500), every other one is answered with its prefill's KV;
* ``recompute`` (recompute 1): every request is answered, the failed ones from KV the decode
  computes itself (no digest to compare: their answers must equal the baseline's; vllm #49250:
  on runner V2 the recompute gathered garbage).

Holds: the connector's ``failed_transfers`` counter, read on every role its metric map counts it
on, grew by one per injected failure; under ``fail`` each of them failed, under ``recompute``
each was answered.
"""
from __future__ import annotations

from typing import Mapping

from harness.core.cell import Cell
from harness.weathers.facts import ServerChanges
from harness.judge.weather import InjectedEvent, WeatherCondition
from harness.run.weather.base import Weather, WeatherRun, Workload
from harness.run.weather.tagged import (SERVER_FAULT_ENV, counted, decode_log, events_of,
                                        share_tag, tagged_records)
from harness.protocol.faults import (FAIL_TRANSFER, FaultSpec, parse_fault_log,
                                     request_fault_tag)

TAG = request_fault_tag(FaultSpec(FAIL_TRANSFER))
MARKER = f"fault.{FAIL_TRANSFER}."


def policy(params: Mapping[str, float]) -> str:
    return "recompute" if params["recompute"] else "fail"


class LoadFailures(Weather):
    name = "load-failures"

    def servers(self, cell: Cell, params: Mapping[str, float]) -> dict[str, ServerChanges]:
        # the policy is the decode scheduler's; the prefill is left as it is
        return {"decode": ServerChanges(kv_transfer=(("kv_load_failure_policy", policy(params)),),
                                        extra_env=SERVER_FAULT_ENV)}

    def workload(self, cell: Cell, params: Mapping[str, float]) -> Workload:
        return Workload(request_tag=share_tag(TAG, params["share"]))

    def events(self, run: WeatherRun) -> tuple[InjectedEvent, ...]:
        fails = policy(run.params) == "fail"
        return events_of(tagged_records(run, MARKER), "read-failed",
                         lambda r: f"read reported failed; kv_load_failure_policy "
                                   f"{policy(run.params)}",
                         may_fail=fails, recomputed=not fails)

    def accounted_checks(self, params: Mapping[str, float]) -> dict[str, str]:
        why = "reads fail on purpose: counted per injected failure (weather-holds)"
        checks = {"no-failed-transfers": why,
                  "kv-bytes-exact": "the failed reads' bytes crossed too; each answered "
                                    "request's digest instead"}
        if params["recompute"]:
            checks["decode-did-not-recompute"] = "the failed reads are recomputed on purpose"
            checks["kv-digest"] = ("a recomputed request has no decode digest: every 200 is "
                                   "judged per request, a recomputed one by its answer")
        return checks

    def conditions(self, run: WeatherRun) -> tuple[WeatherCondition, ...]:
        reached = [r for r in tagged_records(run, MARKER) if r.get("decode_status") is not None]
        applied = {line.request_id for line in parse_fault_log(decode_log(run))
                   if line.applied and line.kind == FAIL_TRANSFER}
        ours = sum(any(str(r["request_id"]) in a for a in applied) for r in reached)
        failed = int(run.counter_delta("failed_transfers"))
        tagged = {str(r.get("request_id")) for r in reached}
        rows = [row for row in run.rows if str(row.request_id) in tagged]
        fails = policy(run.params) == "fail"
        ended = sum((not row.answered) if fails else row.answered for row in rows)
        return (counted("reads-failed", "happened", ours, len(reached),
                        "tagged requests whose read the decode reported failed (fault lines)"),
                counted("failed-transfers-counted", "holds", failed, len(reached),
                        f"{run.counter_source('failed_transfers')} growth against the "
                        "injected failures"),
                counted(f"policy-{policy(run.params)}", "holds", ended, len(rows),
                        "injected requests that " + ("failed loudly" if fails
                                                     else "were answered (recomputed)")))


WEATHER = LoadFailures()
