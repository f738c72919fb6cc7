"""The managed processes of this interpreter: every one started and not yet stopped, their memory
summed, and stopping them all at exit (atexit) or on SIGTERM/SIGHUP/SIGINT.

``ManagedProcess`` registers itself here on start and unregisters once stopped. This module
knows it only through :class:`Registered` (the methods it calls), so it imports nothing of the
harness and ``harness.serve.process`` can import it without a cycle.
"""
from __future__ import annotations

import atexit
import logging
import signal
import threading
import time
from collections.abc import Iterable
from types import FrameType
from typing import Any, Protocol

LOG = logging.getLogger(__name__)

__all__ = [
    "Registered",
    "install_signal_handlers",
    "live_processes",
    "peak_rss_bytes",
    "register",
    "stop_all",
    "total_rss_bytes",
    "unregister",
]


class Registered(Protocol):
    """What the registry needs of a process (``ManagedProcess`` has it)."""

    name: str

    @property
    def pid(self) -> int | None: ...
    def is_running(self) -> bool: ...
    def signal_term(self) -> None: ...
    def stop(self, term_timeout_s: float = 15.0) -> int | None: ...
    def kill(self) -> int | None: ...
    def rss_bytes(self) -> int: ...
    def peak_rss_bytes(self) -> int: ...


_REGISTRY: dict[int, Registered] = {}
# RLock: a signal handler runs on the main thread and may need it while the main thread holds it.
_REGISTRY_LOCK = threading.RLock()


def register(process: Registered) -> None:
    """Add a started process: stop_all() and the exit and signal handlers will stop it."""
    with _REGISTRY_LOCK:
        _REGISTRY[id(process)] = process


def unregister(process: Registered) -> None:
    """Remove a stopped process (no-op if it is not registered)."""
    with _REGISTRY_LOCK:
        _REGISTRY.pop(id(process), None)


def live_processes() -> list[Registered]:
    """Every ManagedProcess started in this interpreter and not yet stopped."""
    with _REGISTRY_LOCK:
        return list(_REGISTRY.values())


def total_rss_bytes(processes: Iterable[Registered] | None = None) -> int:
    """Current RSS of the given processes' trees (default: all live ones), summed."""
    return sum(p.rss_bytes() for p in (live_processes() if processes is None else processes))


def peak_rss_bytes(processes: Iterable[Registered] | None = None) -> int:
    """Sum of per-process RSS high-water marks over the given trees (default: all live ones).
    Read it before stopping the servers: an exited process no longer reports its peak."""
    return sum(p.peak_rss_bytes() for p in (live_processes() if processes is None else processes))


_stop_all_in_progress = False


def stop_all(term_timeout_s: float = 15.0) -> None:
    """Stop every live ManagedProcess, in parallel: all groups get SIGTERM first, then each is
    waited for within one shared deadline and SIGKILLed if still alive. Called at exit.
    Re-entered (a second Ctrl-C during the wait) it SIGKILLs everything at once."""
    global _stop_all_in_progress
    processes = live_processes()
    if _stop_all_in_progress:
        for process in processes:
            process.kill()
        return
    _stop_all_in_progress = True
    try:
        for process in processes:
            process.signal_term()
        deadline = time.monotonic() + term_timeout_s
        for process in processes:
            try:
                process.stop(term_timeout_s=max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - one failure must not leave the others running
                LOG.exception("stopping %s failed", process.name)
    finally:
        _stop_all_in_progress = False


atexit.register(stop_all)

_previous_handlers: dict[int, Any] = {}
_signal_term_timeout_s = 15.0


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _stop_all_in_progress:
        stop_all()  # re-entered: escalates to SIGKILL, then the first invocation finishes up
        return
    LOG.warning("received %s: stopping %d managed process(es)", signal.Signals(signum).name,
                len(live_processes()))
    stop_all(_signal_term_timeout_s)
    previous = _previous_handlers.get(signum)
    if signum == signal.SIGINT:
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)
        raise KeyboardInterrupt
    if callable(previous):
        previous(signum, frame)  # may exit on its own terms
    raise SystemExit(128 + signum)


def install_signal_handlers(term_timeout_s: float = 15.0) -> None:
    """On SIGTERM/SIGHUP: stop all managed processes and exit (status 128+signal); on SIGINT:
    stop them and raise KeyboardInterrupt. A previously installed Python handler is called
    after the stop. Idempotent; must be called from the main thread."""
    global _signal_term_timeout_s
    _signal_term_timeout_s = term_timeout_s
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        previous = signal.getsignal(signum)
        if previous is _on_signal:
            continue
        _previous_handlers[signum] = previous
        signal.signal(signum, _on_signal)
