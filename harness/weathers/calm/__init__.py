"""calm: today's steady workload against roomy KV caches, the default (absent from cell ids). Found
by harness.weathers' scan of its packages: its row (below), its driver (``driver``: every
default of the weather interface)."""
from __future__ import annotations

from harness.weathers.facts import WeatherRow

NAME = "calm"
ROW = WeatherRow(
    summary="today's steady workload (--concurrency in flight), roomy KV caches")
