"""The weathers' drivers, one module per row of harness.core.weathers (base.py: the interface)."""
from __future__ import annotations

import importlib

from harness.core.weathers import weather_row
from harness.run.weather.base import Weather


def weather_for(name: str) -> Weather:
    """The WEATHER of `name`'s module (KeyError names the known weathers)."""
    weather = importlib.import_module(weather_row(name).module).WEATHER
    if not isinstance(weather, Weather) or weather.name != name:
        raise TypeError(f"{weather_row(name).module}.WEATHER is not the Weather {name!r}")
    return weather


__all__ = ["weather_for"]
