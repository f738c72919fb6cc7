"""The weathers' drivers: each weather package's ``driver`` module (harness/weathers/<name>/,
found by harness.weathers), its ``WEATHER`` an instance of a subclass of base.Weather."""
from __future__ import annotations

import importlib

from harness.run.weather.base import Weather
from harness.weathers import WEATHERS, package_of


def weather_for(name: str) -> Weather:
    """The driver of weather `name` (KeyError names the known weathers)."""
    package = package_of(name)
    try:
        module = importlib.import_module(f"{package.__name__}.driver")
    except ModuleNotFoundError as missing:
        if missing.name != f"{package.__name__}.driver":
            raise
        raise KeyError(f"weather {name!r} has a row but its package has no driver "
                       f"module") from None
    return module.WEATHER


def drivers() -> dict[str, Weather]:
    """Every weather's driver, by name."""
    return {name: weather_for(name) for name in WEATHERS}


__all__ = ["drivers", "weather_for"]
