"""Concept packages found by registration, never named in core: the connectors
(harness.connectors) and the weathers (harness.weathers) each keep one :class:`Registration`.

A kind's packages are found three ways, in this order: every package under its folder (a scan),
every one an installed distribution names under its entry-point group, and every one handed to
``register`` (a test's, a downstream repository's). The kind's table is rebuilt from them
whenever the set changes (``refill``), so a registered package is listed, checked by the
matrix and driven like one of the harness's own.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
from types import ModuleType
from typing import Callable, Iterable


class Registration:
    """The packages of one kind: those under `package` (its ``__path__``), those of the
    entry-point `group`, and the registered ones; `refill` rebuilds the kind's table from all."""

    def __init__(self, package: str, path: Iterable[str], group: str,
                 refill: Callable[[list[ModuleType]], None]) -> None:
        self.package, self.path, self.group, self.refill = package, list(path), group, refill
        self.registered: list[ModuleType] = []

    def found(self) -> list[ModuleType]:
        """The packages under the folder, then the installed ones, then the registered ones."""
        here = [importlib.import_module(f"{self.package}.{info.name}")
                for info in pkgutil.iter_modules(self.path) if info.ispkg]
        installed = [entry.load() for entry in importlib.metadata.entry_points(group=self.group)]
        return here + installed + self.registered

    def fill(self) -> None:
        self.refill(self.found())

    def register(self, package: ModuleType) -> None:
        """Add `package` (from outside the folder) and rebuild the table."""
        if package not in self.registered:
            self.registered.append(package)
            self.fill()

    def unregister(self, package: ModuleType) -> None:
        """Take back a package :meth:`register` added and rebuild the table."""
        if package in self.registered:
            self.registered.remove(package)
            self.fill()


__all__ = ["Registration"]
