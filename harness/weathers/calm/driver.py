"""calm: today's steady workload against roomy KV caches (every default of base.Weather)."""
from __future__ import annotations

from harness.run.weather.base import Weather

WEATHER = Weather()
