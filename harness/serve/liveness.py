"""Is a process still alive: the owner of a shared reservation (a port, a GPU lease), or any member
of a process group. Every check goes through psutil; nothing here sends a signal.

A reservation records its owner as (pid, create_time, host). :func:`owner_alive` is the one rule
for whether that owner still holds it, used by the port registry and the GPU leases alike.
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
    "this_host",
]

# psutil's create_time is the process's start in clock ticks since boot plus the boot time, which
# the kernel derives from the wall clock: it can move by a second between two readers. A reused
# PID would need the PID space to wrap within that second.
CREATE_TIME_TOLERANCE_S = 1.0


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
    """``psutil`` create_time of a live, non-zombie ``pid``; None when there is no such process
    or it cannot be read."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except psutil.Error:
        return None


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
        return abs(proc.create_time() - float(create_time)) < CREATE_TIME_TOLERANCE_S
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
