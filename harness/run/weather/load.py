"""load: >= 64 requests in flight, prefix caching on, and P/D KV caches of a few dozen blocks, so
that every block is recycled many times during the run (the issue's concurrency class:
corruption that only shows once blocks are reused). Nothing is injected: every failure is
unaccounted, and must not happen."""
from __future__ import annotations

from typing import Mapping

from harness.core.cell import Cell
from harness.core.weathers import ServerChanges
from harness.judge.weather import WeatherCondition
from harness.run.weather.base import Weather, WeatherRun, Workload


class Load(Weather):
    name = "load"

    def servers(self, cell: Cell, params: Mapping[str, float]) -> dict[str, ServerChanges]:
        changes = ServerChanges(num_blocks=int(params["kv_blocks"]), prefix_caching=True,
                                max_num_seqs=max(int(params["in_flight"]), 128))
        return {"prefill": changes, "decode": changes}

    def workload(self, cell: Cell, params: Mapping[str, float]) -> Workload:
        return Workload(in_flight=int(params["in_flight"]))

    def conditions(self, run: WeatherRun) -> tuple[WeatherCondition, ...]:
        # filled in by step 3 (blocks recycled, proven from the servers' logs and /metrics)
        return ()


WEATHER = Load()
