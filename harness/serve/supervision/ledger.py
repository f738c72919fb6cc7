"""The host's ledger of running servers, the second line of defence after the watchdog: every
started process group is written to ``<lock dir>/processes.json`` (name, pid, pgid, create_time
and its harness's pid, create_time and host) and removed once stopped. An entry whose harness is
dead (``liveness.owner_alive``: pid + create_time) but whose group still runs means both the
harness and its watchdog were killed; the next harness to start a server on this host sweeps
such groups away (SIGTERM, a short grace, SIGKILL: ``process_groups``) before it starts its own,
so they cannot keep a port, GPU memory or a CPU. The same ``filelock`` discipline as the port
registry; any failure here is logged and never stops a server from starting.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock

from harness.core.atomic import atomic_write_text
from harness.serve.host.liveness import owner_alive, process_create_time, this_host
from harness.serve.host.ports import default_lock_dir
from harness.serve.supervision.groups import TrackedGroup, process_table, terminate_groups

LOG = logging.getLogger(__name__)

__all__ = ["LEDGER_NAME", "Orphan", "ProcessLedger", "default_ledger"]

LEDGER_NAME = "processes.json"
SWEEP_GRACE_S = 2.0


@dataclass(frozen=True)
class Orphan:
    """A server group left running by a dead harness, found (and stopped) by a sweep."""

    name: str
    pid: int
    pgid: int
    owner_pid: int

    def is_running(self) -> bool:
        return process_create_time(self.pid) is not None


class ProcessLedger:
    """``processes.json`` in ``lock_dir`` (default: the port registry's directory)."""

    def __init__(self, lock_dir: str | os.PathLike[str] | None = None,
                 lock_timeout_s: float = 10.0) -> None:
        self.path = Path(lock_dir if lock_dir is not None else default_lock_dir()) / LEDGER_NAME
        self._lock = filelock.FileLock(str(self.path) + ".lock", timeout=lock_timeout_s)
        self._owner: tuple[int, float | None] | None = None
        self._warned = False

    def record(self, name: str, pgid: int, create_time: float | None) -> None:
        """Write a started group (its leader is PID ``pgid``) as owned by this process."""
        owner_pid, owner_created = self._owner_of_this_process()
        entry = {"name": name, "pid": pgid, "pgid": pgid, "create_time": create_time,
                 "owner_pid": owner_pid, "owner_create_time": owner_created,
                 "host": this_host(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self._update(lambda entries: entries.__setitem__(str(pgid), entry))

    def forget(self, pgid: int) -> None:
        """Remove a stopped group."""
        self._update(lambda entries: entries.pop(str(pgid), None))

    def entries(self) -> dict[str, dict[str, Any]]:
        """Every recorded group (a copy), keyed by PGID as text."""
        try:
            with self._lock:
                return self._load()
        except (OSError, filelock.Timeout) as exc:
            self._warn(exc)
            return {}

    def sweep(self, grace_s: float = SWEEP_GRACE_S) -> list[Orphan]:
        """Stop the groups of dead harnesses and drop their entries; returns those that were
        still running."""
        stale: list[dict[str, Any]] = []

        def take_stale(entries: dict[str, dict[str, Any]]) -> None:
            for key, entry in list(entries.items()):
                # never this harness's own groups: on 2026-12-01 a sweep judged its own pid
                # dead (a create_time that no longer matched) and stopped what it had started
                if int(entry.get("owner_pid", -1)) == os.getpid() and \
                        entry.get("host") in (None, this_host()):
                    continue
                if not owner_alive(int(entry.get("owner_pid", -1)),
                                   entry.get("owner_create_time"), entry.get("host")):
                    stale.append(entries.pop(key))

        self._update(take_stale)
        if not stale:
            return []
        table = process_table(with_groups=True)
        running = [(TrackedGroup(int(e["pgid"]), e.get("create_time"), str(e.get("name", ""))), e)
                   for e in stale if "pgid" in e]
        running = [(group, e) for group, e in running if group.live_pids(table)]
        if not running:
            return []
        LOG.warning("stopping %d server group(s) left running by dead harness(es): %s",
                    len(running), ", ".join(f"{g.name} (pgid {g.pgid}, harness pid "
                                            f"{e.get('owner_pid')} created "
                                            f"{e.get('owner_create_time')}, now "
                                            f"{process_create_time(int(e.get('owner_pid', -1)))})"
                                            for g, e in running))
        left = terminate_groups([g for g, _ in running], grace_s, say=LOG.warning)
        if left:
            LOG.error("still alive after SIGKILL: %s", sorted(left))
        return [Orphan(g.name, g.pgid, g.pgid, int(e.get("owner_pid", -1))) for g, e in running]

    # -- internals -----------------------------------------------------------------------------
    def _owner_of_this_process(self) -> tuple[int, float | None]:
        if self._owner is None or self._owner[0] != os.getpid():  # a fork is another owner
            self._owner = (os.getpid(), process_create_time(os.getpid()))
        return self._owner

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            LOG.warning("process ledger %s unreadable (%s); starting it afresh", self.path, exc)
            return {}
        groups = raw.get("groups", {}) if isinstance(raw, dict) else {}
        return {str(k): v for k, v in groups.items() if isinstance(v, dict)}

    def _update(self, change: Any) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._lock:
                entries = self._load()
                before = json.dumps(entries, sort_keys=True)
                change(entries)
                if json.dumps(entries, sort_keys=True) != before:
                    atomic_write_text(self.path, json.dumps({"groups": entries}, indent=1,
                                                            sort_keys=True))
        except (OSError, filelock.Timeout) as exc:
            self._warn(exc)

    def _warn(self, exc: BaseException) -> None:
        if not self._warned:
            LOG.warning("process ledger %s: %s (a killed harness's servers are then stopped by "
                        "its watchdog only)", self.path, exc)
        self._warned = True


_DEFAULT: ProcessLedger | None = None
_DEFAULT_LOCK = threading.Lock()


def default_ledger() -> ProcessLedger:
    """The ledger in ``ports.default_lock_dir()`` (one per host and temp dir)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = ProcessLedger()
        return _DEFAULT
