"""Process groups that can be taken down after their harness is gone: the watchdog's and the
ledger sweep's one way of deciding what is ours and of killing it (SIGTERM, a grace, SIGKILL).

A :class:`TrackedGroup` is a server's process group (its leader started a new session, so the
PGID is the leader's PID) plus every descendant seen in it so far, each as (pid, create_time): a
descendant may leave the group (``setsid``) or be re-parented once its parent dies, and is still
reached by its PID. Every signal goes to a PGID or a PID we recorded ourselves, never by name.

What is ours: the kernel keeps a PID out of reuse while any process still has it as its PGID, so
group ``pgid`` is ours unless a process with PID ``pgid`` now runs with another create_time than
the one recorded (our group emptied and the number went to someone else). A remembered descendant
is ours while its create_time matches.
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import psutil

from harness.serve.host.liveness import CREATE_TIME_TOLERANCE_S, start_since_boot

__all__ = ["ProcessTable", "TrackedGroup", "process_table", "terminate_groups"]


@dataclass(frozen=True)
class ProcessTable:
    """One pass over /proc: every process's parent and create_time, and the live (non-zombie)
    members of every process group (only when asked for: it costs a getpgid per process)."""

    parent: Mapping[int, int]
    create_time: Mapping[int, float]
    group_members: Mapping[int, frozenset[int]] = field(default_factory=dict)

    def descendants(self, pid: int) -> list[int]:
        by_parent: dict[int, list[int]] = {}
        for child, ppid in self.parent.items():
            by_parent.setdefault(ppid, []).append(child)
        found, todo = [], list(by_parent.get(pid, []))
        while todo:
            child = todo.pop()
            found.append(child)
            todo.extend(by_parent.get(child, []))
        return found

    def same_process(self, pid: int, create_time: float | None) -> bool:
        """True while ``pid`` runs and (when known) was created at ``create_time``."""
        if pid not in self.create_time:
            return False
        return create_time is None or \
            abs(self.create_time[pid] - create_time) < CREATE_TIME_TOLERANCE_S


def process_table(with_groups: bool = False) -> ProcessTable:
    parent: dict[int, int] = {}
    created: dict[int, float] = {}
    members: dict[int, set[int]] = {}
    attrs = ["ppid", "create_time", "status"] if with_groups else ["ppid", "create_time"]
    for proc in psutil.process_iter(attrs):
        info = proc.info
        if info.get("ppid") is None or info.get("create_time") is None:
            continue  # vanished while being read
        if with_groups and info.get("status") == psutil.STATUS_ZOMBIE:
            continue  # exited: nothing left to kill, only to reap (its parent's job)
        # in seconds since boot, as every create_time the harness records (harness.serve.host.liveness)
        started = start_since_boot(proc.pid)
        if started is None:
            continue
        parent[proc.pid], created[proc.pid] = info["ppid"], started
        if with_groups:
            try:
                members.setdefault(os.getpgid(proc.pid), set()).add(proc.pid)
            except ProcessLookupError:
                continue
    return ProcessTable(parent, created, {pgid: frozenset(p) for pgid, p in members.items()})


@dataclass
class TrackedGroup:
    """A server's process group and every descendant of its leader seen so far."""

    pgid: int
    leader_create_time: float | None = None
    name: str = ""
    seen: dict[int, float] = field(default_factory=dict)  # pid -> create_time

    def is_ours(self, table: ProcessTable) -> bool:
        """False once PID ``pgid`` belongs to another process (see the module's docstring)."""
        if self.pgid not in table.create_time or self.leader_create_time is None:
            return True
        return table.same_process(self.pgid, self.leader_create_time)

    def remember_descendants(self, table: ProcessTable) -> None:
        """Add the leader's current descendants (while the leader is ours and alive)."""
        if not table.same_process(self.pgid, self.leader_create_time):
            return
        if self.leader_create_time is None:
            self.leader_create_time = table.create_time[self.pgid]
        for pid in table.descendants(self.pgid):
            self.seen.setdefault(pid, table.create_time[pid])

    def live_pids(self, table: ProcessTable) -> set[int]:
        """Non-zombie processes of this group and remembered descendants still running
        (``table`` made ``with_groups=True``)."""
        alive = set(table.group_members.get(self.pgid, ())) if self.is_ours(table) else set()
        alive |= {pid for pid, created in self.seen.items() if table.same_process(pid, created)}
        return alive

    def send(self, signum: int, table: ProcessTable) -> None:
        """``signum`` to the group (if still ours) and to every remembered descendant that still
        runs, wherever it is now."""
        if self.is_ours(table):
            try:
                os.killpg(self.pgid, signum)
            except (ProcessLookupError, PermissionError):
                pass  # empty, or only zombies left
        for pid, created in self.seen.items():
            if table.same_process(pid, created):
                try:
                    os.kill(pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass


def terminate_groups(groups: Iterable[TrackedGroup], grace_s: float,
                     say: Callable[[str], None] = lambda message: None,
                     poll_s: float = 0.1, kill_wait_s: float = 5.0) -> set[int]:
    """SIGTERM every group (and its remembered descendants) at once, wait up to ``grace_s`` for
    all of them to exit, SIGKILL what is left, and wait up to ``kill_wait_s`` for that too.
    Returns the PIDs still alive at the end (empty unless something is stuck in the kernel)."""
    groups = list(groups)
    table = process_table(with_groups=True)
    for group in groups:
        group.remember_descendants(table)
        group.send(signal.SIGTERM, table)
    deadline = time.monotonic() + grace_s
    alive = _live(groups, table)
    while alive and time.monotonic() < deadline:
        time.sleep(poll_s)
        table = process_table(with_groups=True)
        alive = _live(groups, table)
    if alive:
        say(f"{len(alive)} process(es) still alive {grace_s:g}s after SIGTERM; SIGKILL: "
            f"{sorted(alive)}")
        deadline = time.monotonic() + kill_wait_s
        while alive and time.monotonic() < deadline:
            for group in groups:
                group.send(signal.SIGKILL, table)
            time.sleep(min(poll_s, 0.05))
            table = process_table(with_groups=True)
            alive = _live(groups, table)
    return alive


def _live(groups: Iterable[TrackedGroup], table: ProcessTable) -> set[int]:
    alive: set[int] = set()
    for group in groups:
        alive |= group.live_pids(table)
    return alive
