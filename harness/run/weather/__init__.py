"""The weathers' drivers, one module per row of harness.core.weathers (base.py: the interface),
registered here under their row's name."""
from __future__ import annotations

from harness.core.weathers import weather_row
from harness.run.weather import (aborts, block_boundary, calm, expiry, load, load_failures,
                                 preemption, restart, soak)
from harness.run.weather.base import Weather

DRIVERS: dict[str, Weather] = {module.WEATHER.name: module.WEATHER for module in (
    calm, load, preemption, expiry, load_failures, aborts, restart, block_boundary, soak)}


def weather_for(name: str) -> Weather:
    """The driver of weather `name` (KeyError names the known weathers)."""
    weather_row(name)
    if name not in DRIVERS:
        raise KeyError(f"weather {name!r} has a row but no driver registered in "
                       f"harness.run.weather")
    return DRIVERS[name]


__all__ = ["DRIVERS", "weather_for"]
