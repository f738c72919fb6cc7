"""The host's ledger of running servers, the second line of defence after the watchdog: every
started process group is written to ``<lock dir>/processes.json`` (name, pid, pgid, create_time
and its harness's pid, create_time and host) and removed once stopped. An entry whose harness is
dead (``liveness.owner_alive``: pid + create_time) but whose group still runs means both the
harness and its watchdog were killed; the next harness to start a server on this host sweeps
such groups away (SIGTERM, a short grace, SIGKILL: ``process_groups``) before it starts its own,
so they cannot keep a port, GPU memory or a CPU. The file is a host store
(harness.serve.host.store): an entry is acted on only when `group_entry_problem` finds nothing
wrong with it (a start time, never null; a group that is not 0, 1 or the harness's own), so a
forged or broken entry is skipped with a warning. Any failure here is logged and never stops a
server from starting.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import filelock

from harness.core.process_wide import ProcessWide
from harness.serve.host.liveness import process_create_time, this_host
from harness.serve.host.store import (HostStore, drop_dead, problem_of_owner,
                                      problem_of_time)
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


def group_entry_problem(key: str, entry: dict[str, Any]) -> str | None:
    """Why a ledger entry must not be acted on (None: it may): its group is the one its key
    names, not 0 or 1 and not this harness's own, its leader's start time is known, and so is
    its owner's."""
    pgid = entry.get("pgid")
    if isinstance(pgid, bool) or not isinstance(pgid, int) or pgid <= 1 or str(pgid) != key:
        return f"pgid {pgid!r} is not a server's group"
    if pgid in (os.getpgrp(), os.getpid()):
        return f"pgid {pgid} is this harness's own group"
    if entry.get("pid") != pgid:
        return f"pid {entry.get('pid')!r} is not the group's leader {pgid}"
    return problem_of_time(entry.get("create_time"), "create_time") or problem_of_owner(entry)


class ProcessLedger:
    """``processes.json`` in ``lock_dir`` (default: this user's host state directory)."""

    def __init__(self, lock_dir: str | os.PathLike[str] | None = None,
                 lock_timeout_s: float = 10.0) -> None:
        self.store: HostStore | None = None
        self._lock_dir, self._lock_timeout_s = lock_dir, lock_timeout_s
        self._owner: tuple[int, float | None] | None = None
        self._warned = False

    @property
    def path(self):
        return self._store().path

    def record(self, name: str, pgid: int, create_time: float | None) -> None:
        """Write a started group (its leader is PID ``pgid``) as owned by this process; a group
        whose entry would not be valid (its leader already gone: no start time) is not kept."""
        owner_pid, owner_created = self._owner_of_this_process()
        entry = {"name": name, "pid": pgid, "pgid": pgid, "create_time": create_time,
                 "owner_pid": owner_pid, "owner_create_time": owner_created,
                 "host": this_host(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        problem = group_entry_problem(str(pgid), entry)
        if problem:
            LOG.warning("not recording %s in the process ledger: %s", name, problem)
            return
        self._update(lambda entries: entries.__setitem__(str(pgid), entry))

    def forget(self, pgid: int) -> None:
        """Remove a stopped group."""
        self._update(lambda entries: entries.pop(str(pgid), None))

    def entries(self) -> dict[str, dict[str, Any]]:
        """Every recorded group (a copy), keyed by PGID as text."""
        try:
            return self._store().read()
        except (OSError, filelock.Timeout) as exc:
            self._warn(exc)
            return {}

    def sweep(self, grace_s: float = SWEEP_GRACE_S) -> list[Orphan]:
        """Stop the groups of dead harnesses and drop their entries; returns those that were
        still running."""
        stale: list[dict[str, Any]] = []

        def take_stale(entries: dict[str, dict[str, Any]]) -> None:
            # never this harness's own groups: a sweep once judged its own pid dead (a
            # create_time that no longer matched) and stopped what it had started
            own = {k: e for k, e in entries.items() if e["owner_pid"] == os.getpid()
                   and e.get("host") in (None, this_host())}
            others = {k: e for k, e in entries.items() if k not in own}
            stale.extend(drop_dead(others).values())
            entries.clear()
            entries.update({**own, **others})

        self._update(take_stale)
        if not stale:
            return []
        table = process_table(with_groups=True)
        running = [(TrackedGroup(int(e["pgid"]), float(e["create_time"]), str(e.get("name", ""))), e)
                   for e in stale]
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

    def _store(self) -> HostStore:
        # made on first use: an unusable state directory is then one warning, not a failed start
        if self.store is None:
            self.store = HostStore(LEDGER_NAME, "groups", group_entry_problem,
                                   directory=self._lock_dir, lock_timeout_s=self._lock_timeout_s)
        return self.store

    def _update(self, change: Any) -> None:
        try:
            self._store().update(change)
        except (OSError, filelock.Timeout) as exc:
            self._warn(exc)

    def _warn(self, exc: BaseException) -> None:
        if not self._warned:
            LOG.warning("process ledger: %s (a killed harness's servers are then stopped by "
                        "its watchdog only)", exc)
        self._warned = True


default_ledger = ProcessWide(
    ProcessLedger,
    "The ledger in this user's host state directory (one per host, user and temp dir).")
