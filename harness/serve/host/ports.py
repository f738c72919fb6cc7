"""Ports that never collide: not between servers of one run, not between pytest-xdist workers,
not between concurrent harness runs on one machine.

A port is handed out only if (a) no live process holds it in the shared registry and (b) it can
be bound right now (``port_for.port_is_used``: connect + bind on 127.0.0.1 and 0.0.0.0). The
registry is a JSON file in ``lock_dir`` guarded by a ``filelock.FileLock``; it maps
port -> {pid, create_time, host, owner, time}. A reservation whose process is gone (or whose PID
now belongs to another process: the create_time differs; ``liveness.owner_alive``) is reclaimed
by the next caller, so a SIGKILLed harness leaks nothing for long. Ports in the kernel's
ephemeral range are never handed out: the kernel may give them to any outgoing connection
between our check and the server's bind.
"""
from __future__ import annotations

import atexit
import logging
import os
import random
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import filelock
import port_for
import port_for.ephemeral

from harness.core.process_wide import ProcessWide
from harness.serve.host.liveness import owner_alive, process_create_time, this_host
from harness.serve.host.store import HostStore, default_state_dir, problem_of_owner

LOG = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_PORT_RANGE",
    "PortAllocator",
    "PortsExhaustedError",
    "default_allocator",
    "default_lock_dir",
]

DEFAULT_PORT_RANGE = (20000, 40000)
_REGISTRY_NAME = "registry.json"


class PortsExhaustedError(RuntimeError):
    """No free port (or no contiguous run of free ports) was found in the allocator's range."""


def default_lock_dir() -> Path:
    """This user's host state directory (harness.serve.host.store.default_state_dir)."""
    return default_state_dir()


def port_entry_problem(key: str, entry: dict[str, Any]) -> str | None:
    """Why a registry entry cannot be trusted (None: it can): a port in range, its holder's
    pid (create_time may be unknown: a port entry only ever keeps a port from being handed out)."""
    if not key.isdigit() or not 1 <= int(key) <= 65535:
        return f"{key[:20]!r} is not a port"
    if entry.get("create_time") is None:
        entry = {**entry, "create_time": 1.0}
    return problem_of_owner(entry, "pid", "create_time")


def _holder_alive(entry: dict[str, Any]) -> bool:
    return owner_alive(int(entry.get("pid", -1)), entry.get("create_time"), entry.get("host"))


class PortAllocator:
    """Reserve ports in ``port_range`` = [low, high) through a registry shared via ``lock_dir``.

    Reserved ports stay reserved until ``release()``, or until this process exits (atexit), or —
    if it dies without running atexit — until another allocator notices the PID is gone.
    """

    def __init__(self, lock_dir: str | os.PathLike[str] | None = None,
                 port_range: tuple[int, int] = DEFAULT_PORT_RANGE,
                 lock_timeout_s: float = 60.0) -> None:
        low, high = port_range
        if not 1024 <= low < high <= 65536:
            raise ValueError(f"bad port range {port_range}: need 1024 <= low < high <= 65536")
        self.store = HostStore(_REGISTRY_NAME, "ports", port_entry_problem, directory=lock_dir,
                               lock_timeout_s=lock_timeout_s)
        self.lock_dir = self.store.directory
        self.port_range = (low, high)
        self.registry_path = self.store.path
        self._lock = self.store.lock
        self._thread_lock = threading.Lock()
        self._mine: set[int] = set()
        self._pid = os.getpid()
        self._create_time = process_create_time(self._pid)
        self._host = this_host()
        self._atexit_registered = False
        self.candidates = self._candidate_ports()

    def _candidate_ports(self) -> list[int]:
        low, high = self.port_range
        ports = set(range(low, high))
        ephemeral: set[int] = set()
        for eph_low, eph_high in port_for.ephemeral.port_ranges():
            ephemeral.update(range(eph_low, eph_high + 1))
        if ports - ephemeral:
            ports -= ephemeral
        else:
            LOG.warning("port range %s lies inside the ephemeral range; using it anyway",
                        self.port_range)
        return sorted(ports)

    # -- registry ------------------------------------------------------------------------------
    def _load(self) -> dict[int, dict[str, Any]]:
        return {int(port): entry for port, entry in self.store.load().items()}

    def _save(self, registry: dict[int, dict[str, Any]]) -> None:
        self.store.save({str(port): registry[port] for port in sorted(registry)})

    def _load_live(self) -> dict[int, dict[str, Any]]:
        registry = self._load()
        alive_by_holder: dict[tuple[Any, Any, Any], bool] = {}  # one psutil look-up per holder
        dead = []
        for port, entry in registry.items():
            holder = (entry.get("pid"), entry.get("create_time"), entry.get("host"))
            if holder not in alive_by_holder:
                alive_by_holder[holder] = _holder_alive(entry)
            if not alive_by_holder[holder]:
                dead.append(port)
        for port in dead:
            LOG.info("reclaiming port %d from dead pid %s (%s)", port, registry[port].get("pid"),
                     registry[port].get("owner"))
            del registry[port]
        return registry

    def _entry(self, owner: str) -> dict[str, Any]:
        return {"pid": self._pid, "create_time": self._create_time, "host": self._host,
                "owner": owner, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}

    def _commit(self, registry: dict[int, dict[str, Any]], ports: list[int], owner: str) -> None:
        for port in ports:
            registry[port] = self._entry(owner)
        self._save(registry)
        self._mine.update(ports)
        if not self._atexit_registered:
            atexit.register(self.release_all)
            self._atexit_registered = True

    # -- public API ----------------------------------------------------------------------------
    def reserve(self, n: int, owner: str) -> list[int]:
        """Reserve ``n`` distinct free ports (not necessarily adjacent) for ``owner`` (a label
        such as "decode-0/http", stored for whoever inspects the registry)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        with self._thread_lock, self._lock:
            registry = self._load_live()
            chosen: list[int] = []
            for _ in range(n):
                try:
                    # port_for checks connectability and bindability; it mutates the set it gets
                    port = port_for.select_random(set(self.candidates),
                                                  exclude_ports=set(registry) | set(chosen))
                except port_for.PortForException as exc:
                    raise PortsExhaustedError(
                        f"no free port in {self.port_range} for {owner!r} "
                        f"({len(registry)} reserved in {self.registry_path})") from exc
                chosen.append(port)
            self._commit(registry, chosen, owner)
        LOG.debug("reserved %s for %s", chosen, owner)
        return chosen

    def reserve_block(self, size: int, owner: str, attempts: int = 200) -> list[int]:
        """Reserve ``size`` contiguous free ports [p, p+size) — e.g. a connector's side
        channel, which vLLM opens at its base port + rank for each TP rank."""
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        with self._thread_lock, self._lock:
            registry = self._load_live()
            candidate_set = set(self.candidates)
            starts = [p for p in self.candidates
                      if all(q in candidate_set and q not in registry for q in range(p, p + size))]
            random.shuffle(starts)
            for start in starts[:attempts]:
                block = list(range(start, start + size))
                if not any(port_for.port_is_used(port) for port in block):
                    self._commit(registry, block, owner)
                    LOG.debug("reserved block %s for %s", block, owner)
                    return block
        raise PortsExhaustedError(f"no {size} contiguous free ports in {self.port_range} "
                                  f"for {owner!r}")

    def release(self, ports: Iterable[int]) -> None:
        """Give ports back. Only ports this process reserved are removed from the registry."""
        to_release = {int(port) for port in ports}
        if not to_release:
            return
        with self._thread_lock, self._lock:
            registry = self._load()
            for port in to_release:
                entry = registry.get(port)
                if entry is not None and int(entry.get("pid", -1)) == self._pid:
                    del registry[port]
                elif entry is not None:
                    LOG.warning("not releasing port %d: held by pid %s (%s)", port,
                                entry.get("pid"), entry.get("owner"))
            self._save(registry)
            self._mine -= to_release

    def release_all(self) -> None:
        """Release every port this allocator reserved in this process (runs at exit)."""
        if self._mine and os.getpid() == self._pid:  # not in a fork()ed child
            try:
                self.release(set(self._mine))
            except (OSError, filelock.Timeout) as exc:  # at exit: dead-PID reclaim covers it
                LOG.warning("could not release ports %s: %s", sorted(self._mine), exc)

    def reservations(self) -> dict[int, dict[str, Any]]:
        """Snapshot of the live registry: port -> {pid, create_time, host, owner, time}."""
        with self._thread_lock, self._lock:
            return self._load_live()


default_allocator = ProcessWide(
    PortAllocator, "The process-wide allocator over DEFAULT_PORT_RANGE and default_lock_dir().")
