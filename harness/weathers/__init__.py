"""The weathers a cell can be judged in, found by registration: one package per weather, none
named here but the default and the order lists show them in.

A weather package holds everything the harness knows and does with its weather:

- ``NAME`` (the ``weather`` value) and ``ROW``: its :class:`~harness.weathers.facts.WeatherRow`
  (its parameters, devices, vLLM, prompts, rules of its own), which the matrix checks before
  any server starts;
- ``driver``: its ``WEATHER``, a :class:`harness.run.weather.base.Weather` (what it changes in
  the pair's servers, the workload it sends, the events it injects and what must hold
  afterwards: what it requires of the verdict), found by harness.run.weather;
- optional: ``in_server`` (its fault inside the decode, armed by the faults plugin under
  ``PD_ACCURACY_FAULT=by-request``), ``proxy`` (its hops in the harness's proxy), ``protocol``
  (the tags and lines its parts exchange), ``HOOKS`` and ``HOOK_PLUGINS`` (its rows of the vLLM
  compatibility table, harness.core.vllm_hooks).

Packages are found three ways: every package under harness/weathers/ (a scan), every one an
installed distribution names under the entry-point group ``pd_accuracy.weathers``, and every one
handed to :func:`register`. A weather that drives a connector's own machinery
(``needs_connector``) runs with the connectors whose row lists it; the others run with any.

``calm`` is today's polite, steady workload against roomy KV caches: the default, absent from
cell ids. Every other weather is judged by the verdict under weather (harness.judge.weather):
*silent wrong answers: 0*. A cell's weather parameters are parsed here (:func:`weather_problem`,
:func:`resolved_params`, :func:`params_token`), each against its row's
:class:`~harness.weathers.facts.WeatherParam`.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Mapping

from harness.connectors import KV_CONNECTORS, connector_row
from harness.core.registration import Registration
from harness.weathers.facts import WeatherRow, WeatherRule

ENTRY_POINTS = "pd_accuracy.weathers"
DEFAULT_WEATHER = "calm"
# the order lists, help and reasons show weathers in; a package's weather missing here comes
# after these, in the order the packages are found
LISTED = ("calm", "load", "preemption", "expiry", "load-failures", "aborts", "restart",
          "block-boundary", "soak")
# what the table is made of, and the table itself: filled below, refilled by register()
_PACKAGES: dict[str, ModuleType] = {}
WEATHERS: dict[str, WeatherRow] = {}


def _refill(packages: list[ModuleType]) -> None:
    found = {p.NAME: p for p in packages}
    order = {name: i for i, name in enumerate(LISTED)}
    ranked = sorted(found, key=lambda name: order.get(name, len(order)))   # stable: found order
    _PACKAGES.clear()
    _PACKAGES.update((name, found[name]) for name in ranked)
    WEATHERS.clear()
    WEATHERS.update((name, found[name].ROW) for name in ranked)


_REGISTRATION = Registration(__name__, __path__, ENTRY_POINTS, _refill)
# add a weather package from outside harness/weathers/ (its NAME, ROW...); take it back
register, unregister = _REGISTRATION.register, _REGISTRATION.unregister


def packages() -> tuple[ModuleType, ...]:
    """Every weather package, in the order lists show their weathers."""
    return tuple(_PACKAGES.values())


def package_of(name: str) -> ModuleType:
    """The package of weather ``name`` (KeyError names the known weathers)."""
    weather_row(name)
    if name not in _PACKAGES:
        raise KeyError(f"weather {name!r} has a row but no package") from None
    return _PACKAGES[name]


def package_hooks() -> tuple[tuple[ModuleType, Any], ...]:
    """(package, hook) for every row of the compatibility table a weather package adds."""
    return tuple((p, hook) for p in _PACKAGES.values() for hook in getattr(p, "HOOKS", ()))


def weather_rules() -> tuple[tuple[str, WeatherRule], ...]:
    """(weather, rule) for every validity rule a weather adds for its own cells."""
    return tuple((name, rule) for name, row in WEATHERS.items() for rule in row.rules)


def weather_row(value: str) -> WeatherRow:
    """The row of ``value``; KeyError names the known values."""
    try:
        return WEATHERS[value]
    except KeyError:
        raise KeyError(f"unknown weather {value!r}; use one of {', '.join(WEATHERS)}") from None


def runs_with(weather: str, kv_connector: str) -> bool:
    """Whether a cell of `kv_connector` can be judged in `weather` (both known)."""
    return not weather_row(weather).needs_connector or weather in connector_row(kv_connector).weathers


def weather_connectors(weather: str) -> tuple[str, ...]:
    """The kv_connector values `weather` runs with (every one unless it needs its connector)."""
    return tuple(v for v in KV_CONNECTORS if runs_with(weather, v))


def weather_problem(weather: str, params: Mapping[str, Any]) -> str | None:
    """Why (`weather`, `params`) is not a weather the table knows, in one line; None if it is."""
    row = WEATHERS.get(weather)
    if row is None:
        return f"unknown weather {weather!r}; use one of {', '.join(WEATHERS)}"
    for name, value in params.items():
        spec = row.params.get(name)
        if spec is None:
            known = ", ".join(row.params) or "none"
            return f"weather {weather} takes no parameter {name!r} (it takes: {known})"
        problem = spec.problem(name, value)
        if problem:
            return f"weather {weather}: {problem}"
    return None


def resolved_params(weather: str, params: Mapping[str, Any]) -> dict[str, float]:
    """Every parameter of `weather`: the given ones, the row's defaults for the rest."""
    row = weather_row(weather)
    return {name: (int if spec.integer else float)(params.get(name, spec.default))
            for name, spec in row.params.items()}


def params_token(params: tuple[tuple[str, Any], ...]) -> str:
    """The id suffix of explicitly set parameters ("in_flight=96" -> "in_flight96")."""
    return "".join(f"_{k}{_number_token(v)}" for k, v in params)


def _number_token(value: Any) -> str:
    """A parameter's value in an id: %g for numbers a float holds, else its text (cut)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return f"{value:g}"
        except OverflowError:   # a 400-digit integer: the rules refuse it; the id must not crash
            return str(value)[:20]
    return str(value)[:40]


_REGISTRATION.fill()

__all__ = ["DEFAULT_WEATHER", "ENTRY_POINTS", "LISTED", "WEATHERS", "package_hooks", "package_of",
           "packages", "params_token", "register", "resolved_params", "runs_with", "unregister",
           "weather_connectors", "weather_problem", "weather_row", "weather_rules"]
