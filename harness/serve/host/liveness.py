"""Is a process still alive: the owner of a shared reservation (a port, a GPU lease), or any member
of a process group. Every check goes through psutil; nothing here sends a signal.

A reservation records its owner as (pid, create_time, host). :func:`owner_alive` is the one rule
for whether that owner still holds it, used by the port registry and the GPU leases alike.

A create_time here is the process's start in seconds since boot (``/proc/PID/stat``, field 22):
the same number for every reader at any time. psutil's create_time adds the boot time, which
each process reads once from the wall clock. On 2026-12-03 a VM's clock moved 13 s after a
harness had recorded itself. Every other process then saw that live harness as dead. A unit
test's pytest session swept its "orphans" and SIGTERMed a running smoke cell's proxy.
"""
from __future__ import annotations

import os
import socket

import psutil

__all__ = [
    "CREATE_TIME_TOLERANCE_S",
    "is_zombie",
    "owner_alive",
    "process_create_time",
    "process_group_alive",
    "same_start",
    "start_since_boot",
    "this_host",
]

# a start since boot is exact (whole clock ticks); the tolerance stays for records written by an
# older harness in psutil's terms (below). A reused PID would need the PID space to wrap within
# that second.
CREATE_TIME_TOLERANCE_S = 1.0
# a recorded create_time above this (2001-09-09 in epoch seconds, 31 years of uptime) is psutil's
# wall-clock create_time, written by an older harness still running on this host
_EPOCH_RECORD = 1e9
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def start_since_boot(pid: int) -> float | None:
    """When ``pid`` started, in seconds since boot (field 22 of ``/proc/PID/stat``: clock
    ticks); None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # after the command name, which may hold spaces and parentheses: field 3 onwards
        return int(stat[stat.rindex(b")") + 2:].split()[19]) / _CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return None


def this_host() -> str:
    """The host name recorded with a reservation (``socket.gethostname()``)."""
    return socket.gethostname()


def is_zombie(proc: psutil.Process) -> bool:
    """True when ``proc`` has exited (a zombie waiting to be reaped, or gone)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def process_create_time(pid: int) -> float | None:
    """When a live, non-zombie ``pid`` started, in seconds since boot (psutil's create_time
    where /proc cannot say); None when there is no such process or it cannot be read."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        started = start_since_boot(pid)
        return proc.create_time() if started is None else started
    except psutil.Error:
        return None


def same_start(pid: int, proc: psutil.Process, recorded: float) -> bool:
    """Whether ``proc`` (PID ``pid``) is the process recorded as started at ``recorded``."""
    # an older harness's record is in psutil's wall-clock terms, as is any start /proc cannot say
    started = None if recorded > _EPOCH_RECORD else start_since_boot(pid)
    return abs((proc.create_time() if started is None else started) - recorded) \
        < CREATE_TIME_TOLERANCE_S


def owner_alive(pid: int, create_time: float | None, host: str | None = None) -> bool:
    """Whether the process recorded as (``pid``, ``create_time``, ``host``) still exists.

    The rule:

    * ``host`` recorded and not this host: True. Another host's processes cannot be checked from
      here, so its reservation is kept (it is that host's to reclaim).
    * no process ``pid``, or it is a zombie: False.
    * the process cannot be inspected (AccessDenied): True. It exists; keeping the reservation
      can at worst leak it, reclaiming it could double-book.
    * ``create_time`` recorded (non-zero): True only if the process's create_time is within
      :data:`CREATE_TIME_TOLERANCE_S` of it; otherwise the PID was reused by another process.
      Not recorded: True (the PID alone is all there is to go by).
    """
    if host and host != this_host():
        return True
    if pid <= 0:
        return False  # psutil.Process(0) is the kernel's idle task on Linux, not an owner
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if not create_time:
            return True
        return same_start(pid, proc, float(create_time))
    except psutil.NoSuchProcess:  # ZombieProcess included
        return False
    except psutil.AccessDenied:
        return True


def process_group_alive(pgid: int) -> bool:
    """True while any non-zombie process is in process group ``pgid``.

    ``killpg(pgid, 0)`` alone is not enough: it succeeds while a dead member waits to be reaped.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's group with that id: it exists
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and not is_zombie(proc):
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False
