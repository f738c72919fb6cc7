"""The made-up weather's driver: a decode switch, tagged requests, failed transfers counted
through the cell's connector's metric map."""
from __future__ import annotations

from typing import Mapping

from harness.judge.weather import WeatherCondition
from harness.run.weather.base import Weather, WeatherRun, Workload
from harness.weathers.facts import ServerChanges

TAG = "wx.drizzle."


class Drizzle(Weather):
    name = "drizzle"

    def servers(self, cell, params: Mapping[str, float]) -> dict[str, ServerChanges]:
        return {"decode": ServerChanges(extra_env=(("DRIZZLE_SHARE", f"{params['share']:g}"),))}

    def workload(self, cell, params: Mapping[str, float]) -> Workload:
        return Workload(request_tag=TAG)

    def conditions(self, run: WeatherRun) -> tuple[WeatherCondition, ...]:
        failed = run.counter_delta("failed_transfers")
        return (WeatherCondition("happened", "drizzled", failed > 0,
                                 f"{run.counter_source('failed_transfers')}: {failed:g}"),)


WEATHER = Drizzle()
