"""restart: the prefill, then the decode, killed and restarted mid-run. Found by harness.weathers'
scan of its packages: its row (below), its driver (``driver``: the kills and relaunches, the
proxy's hold)."""
from __future__ import annotations

from harness.weathers.facts import WeatherParam, WeatherRow

NAME = "restart"
ROW = WeatherRow(
    params={"after_s": WeatherParam(4, low=1, high=120,
                                    meaning="seconds of traffic before each kill"),
            "min_questions": WeatherParam(100, low=50, integer=True,
                                          meaning="questions of the first look: traffic "
                                                  "before, during and after both restarts")},
    needs_connector=True,
    summary="the prefill, then the decode, killed and restarted mid-run")
