"""The KV connectors a cell can name, found by registration: one package per connector (or
family), none named here.

A connector package holds everything the harness knows and does with its connector:

- ``ROWS``: ``kv_connector`` value -> :class:`~harness.connectors.facts.ConnectorRow` (its facts,
  which the matrix rules check before any server starts; a value it does not drive says why);
- ``DRIVERS``: one :class:`~harness.connectors.driver.KvConnector` per driven row (the servers'
  config, the proxy's params, its metric map and log patterns);
- ``HOOKS`` and ``HOOK_PLUGINS`` (optional): its rows of the vLLM compatibility table
  (harness.core.vllm_hooks) and the module of the package that attaches each;
- ``in_server`` (optional, a module or a package of modules): what it does its own way at vLLM's
  connector interface, loaded only inside the servers (harness.serve.plugins.kv_events);
- ``SERVER_VARIABLES`` (optional): the PD_ACCURACY_* variables its in-server part reads, each
  with the parse it uses there; the command line checks them before any server starts.

Packages are found three ways: every package under harness/connectors/ (a scan), every one an
installed distribution names under the entry-point group ``pd_accuracy.connectors``, and every
one handed to :func:`register` (a test's, a downstream repository's). vLLM's connectors the
harness does not drive are listed, with why, in harness.connectors.vllm_registry.

The table is read by core (a cell's default) and the matrix before anything above core is
imported, so a package's ``__init__`` imports only core and its own modules; its in-server part
is never imported here.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

from harness.connectors.driver import KvConnector
from harness.connectors.facts import ConnectorRow
from harness.connectors.vllm_registry import DEFAULT_KV_CONNECTOR, LISTED, NOT_DRIVEN
from harness.core.registration import Registration

ENTRY_POINTS = "pd_accuracy.connectors"
# what the table is made of, and the table itself: filled below, refilled by register()
_PACKAGES: list[ModuleType] = []
KV_CONNECTORS: dict[str, ConnectorRow] = {}
CONNECTORS: dict[str, KvConnector] = {}
_LOG_PATTERNS: dict[str, str | None] = {}


def _refill(packages: list[ModuleType]) -> None:
    rows = {**NOT_DRIVEN, **{v: r for p in packages for v, r in p.ROWS.items()}}
    order = {value: i for i, value in enumerate(LISTED)}
    ranked = sorted(rows, key=lambda v: order.get(v, len(order)))   # stable: found order after
    drivers = {d.value: d for p in packages for d in getattr(p, "DRIVERS", ())}
    _PACKAGES[:] = sorted(packages, key=lambda p: min(order.get(v, len(order)) for v in p.ROWS))
    KV_CONNECTORS.clear()
    KV_CONNECTORS.update((v, rows[v]) for v in ranked)
    CONNECTORS.clear()
    CONNECTORS.update((v, drivers[v]) for v in ranked if v in drivers)
    _LOG_PATTERNS.clear()


def variable_parsers() -> dict[str, Any]:
    """Every connector package's SERVER_VARIABLES: name -> parse (ValueError: refused)."""
    return {name: parse for p in _PACKAGES for name, parse in
            getattr(p, "SERVER_VARIABLES", {}).items()}


_REGISTRATION = Registration(__name__, __path__, ENTRY_POINTS, _refill)
# add a connector package from outside harness/connectors/ (its ROWS, DRIVERS...); take it back
register, unregister = _REGISTRATION.register, _REGISTRATION.unregister


def packages() -> tuple[ModuleType, ...]:
    """Every connector package, in the order lists show their connectors."""
    return tuple(_PACKAGES)


def connector_row(value: str) -> ConnectorRow:
    """The row of ``value``; KeyError names the known values."""
    try:
        return KV_CONNECTORS[value]
    except KeyError:
        raise KeyError(f"unknown kv_connector {value!r}; use one of {', '.join(KV_CONNECTORS)}") from None


def driven_connectors() -> tuple[str, ...]:
    """The values the harness drives (the others are listed, with why not)."""
    return tuple(v for v, row in KV_CONNECTORS.items() if row.driven)


def connector_for(value: str = DEFAULT_KV_CONNECTOR) -> KvConnector:
    """The driver of ``value`` (KeyError: unknown value, naming the known ones, or one the
    harness does not drive, saying why)."""
    row = connector_row(value)
    if not row.driven:
        raise KeyError(f"kv_connector {value!r} ({row.vllm_name}) is not driven by the harness: "
                       f"{row.not_driven}")
    if value not in CONNECTORS:
        raise KeyError(f"kv_connector {value!r} is driven, but its package lists no driver "
                       f"for it (DRIVERS)")
    return CONNECTORS[value]


def log_patterns(kind: str) -> str | None:
    """One regex of every driven connector's ``LogPatterns.<kind>`` (None: none has one): a
    server log is read before anyone asks which connector wrote it."""
    if kind not in _LOG_PATTERNS:
        found = {getattr(connector_for(v).log, kind) for v in driven_connectors()} - {None}
        _LOG_PATTERNS[kind] = "|".join(f"(?:{p})" for p in sorted(found)) or None
    return _LOG_PATTERNS[kind]


def package_hooks() -> tuple[tuple[ModuleType, Any], ...]:
    """(package, hook) for every row of the compatibility table a connector package adds."""
    return tuple((p, hook) for p in _PACKAGES for hook in getattr(p, "HOOKS", ()))


_REGISTRATION.fill()

__all__ = ["CONNECTORS", "DEFAULT_KV_CONNECTOR", "ENTRY_POINTS", "KV_CONNECTORS", "connector_for", "variable_parsers",
           "connector_row", "driven_connectors", "log_patterns", "package_hooks", "packages",
           "register", "unregister"]
