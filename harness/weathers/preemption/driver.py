"""preemption: a decode KV cache too small for the requests it runs, so that vLLM preempts some
and resumes them later (a preempted P/D request frees its received blocks and recomputes on the
decode when it resumes; vLLM 0.32 counts its prompt tokens by source once, at the first
schedule, so decode-did-not-recompute still holds: 7 preemptions, 0 local prompt tokens). Nothing is injected: every answer must stay right, and
no request may fail. That it blew is proven from the decode's /metrics
(``vllm:num_preemptions_total`` grew)."""
from __future__ import annotations

from typing import Mapping

from harness.core.cell import Cell
from harness.weathers.facts import ServerChanges
from harness.judge.weather import WeatherCondition
from harness.run.weather.base import Weather, WeatherRun, Workload

PREEMPTIONS = "vllm:num_preemptions_total"


class Preemption(Weather):
    name = "preemption"

    def servers(self, cell: Cell, params: Mapping[str, float]) -> dict[str, ServerChanges]:
        return {"decode": ServerChanges(num_blocks=int(params["decode_kv_blocks"]))}

    def workload(self, cell: Cell, params: Mapping[str, float]) -> Workload:
        in_flight = int(params["in_flight"])
        return Workload(in_flight=in_flight, min_questions=2 * in_flight)

    def conditions(self, run: WeatherRun) -> tuple[WeatherCondition, ...]:
        preempted = run.metric_delta_role("decode", PREEMPTIONS)
        return (WeatherCondition(
            "happened", "preempted", preempted > 0,
            f"the decode preempted {preempted:.0f} times during the run ({PREEMPTIONS})"),)


WEATHER = Preemption()
