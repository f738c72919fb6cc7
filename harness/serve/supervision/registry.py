"""The managed processes of this interpreter: every one started and not yet stopped, their memory
summed, and stopping them all at exit (atexit) or on SIGTERM/SIGHUP/SIGINT.

``ManagedProcess`` registers itself here on start and unregisters once stopped, and registering
is what every line of defence hears of: this interpreter's registry (``stop_all``, the exit and
signal handlers), the ``watchdog`` process (the harness dies without running any of them: SIGKILL)
and the host's ``process_ledger`` (the watchdog died too: the next harness sweeps the orphans,
in :func:`prepare_start`). This module knows a process only through :class:`Registered` (the
methods it calls), so it never imports ``harness.serve.supervision.process`` and that can import it.
"""
from __future__ import annotations

import atexit
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, Protocol

from harness.serve.net.netns import sweep_orphan_topologies
from harness.serve.supervision.ledger import Orphan, default_ledger
from harness.serve.supervision.watchdog import default_watchdog

LOG = logging.getLogger(__name__)

__all__ = [
    "Registered",
    "install_signal_handlers",
    "interrupted_by",
    "raise_if_interrupted",
    "live_processes",
    "peak_rss_bytes",
    "prepare_start",
    "register",
    "stop_all",
    "sweep_orphans",
    "total_rss_bytes",
    "unregister",
]


class Registered(Protocol):
    """What the registry needs of a process (``ManagedProcess`` has it)."""

    name: str

    @property
    def pid(self) -> int | None: ...
    @property
    def pgid(self) -> int | None: ...
    @property
    def create_time(self) -> float | None: ...
    def is_running(self) -> bool: ...
    def signal_term(self) -> None: ...
    def stop(self, term_timeout_s: float = 15.0) -> int | None: ...
    def kill(self) -> int | None: ...
    def rss_bytes(self) -> int: ...
    def peak_rss_bytes(self) -> int: ...


_REGISTRY: dict[int, Registered] = {}
# RLock: a signal handler runs on the main thread and may need it while the main thread holds it.
_REGISTRY_LOCK = threading.RLock()


def prepare_start() -> Callable[[], None] | None:
    """Before a process starts: refuse after an interrupt, sweep the orphans of dead harnesses
    off this host and make sure the watchdog runs. Returns the child's ``preexec_fn`` part that
    registers it with the watchdog before exec (None without a watchdog)."""
    raise_if_interrupted()
    sweep_orphans()
    return default_watchdog().announcer()


def sweep_orphans() -> list[Orphan]:
    """Stop every server group on this host whose harness is dead (``process_ledger``), then
    remove the network namespaces of dead runs (``netns``); returns the groups that were still
    running."""
    orphans = default_ledger().sweep()
    sweep_orphan_topologies()
    return orphans


def register(process: Registered) -> None:
    """Add a started process: stop_all() and the exit and signal handlers will stop it, the
    watchdog if this process dies, the next harness's sweep if the watchdog dies too."""
    with _REGISTRY_LOCK:
        _REGISTRY[id(process)] = process
    if process.pgid is not None:
        default_watchdog().watch(process.pgid, process.create_time, process.name)
        default_ledger().record(process.name, process.pgid, process.create_time)


def unregister(process: Registered) -> None:
    """Remove a stopped process (no-op if it is not registered)."""
    with _REGISTRY_LOCK:
        registered = _REGISTRY.pop(id(process), None) is not None
    if registered and process.pgid is not None:
        default_watchdog().unwatch(process.pgid)
        default_ledger().forget(process.pgid)


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


# atexit runs handlers last-registered first: the watchdog's socket is closed after stop_all,
# when nothing is registered with it any more (it then exits at once); none made, none to close.
atexit.register(lambda: (dog := default_watchdog.made()) is not None and dog.close(wait_s=0.5))
atexit.register(stop_all)

_previous_handlers: dict[int, Any] = {}
_signal_term_timeout_s = 15.0
# The signal that stopped this run, latched: the KeyboardInterrupt / SystemExit the handler raises
# lands on the main thread wherever it is, and can be replaced there by the error it causes
# elsewhere (an evaluation thread's ServerDisconnectedError, re-raised in a `finally`) and caught
# as a cell's failure. Measured 2026-12-02: a SIGINT during `--repeats` wrote a FAIL record for
# every repeat not yet judged, and a `-k hybrid` run started its next group's servers.
_interrupted_by: int | None = None


def interrupted_by() -> int | None:
    """The signal (SIGINT/SIGTERM/SIGHUP) that stopped this run, None while none did."""
    return _interrupted_by


def raise_if_interrupted() -> None:
    """Re-raise a latched stop: KeyboardInterrupt for SIGINT, SystemExit(128 + n) otherwise.
    Called where a run would go on (a process starting, a verdict being recorded)."""
    if _interrupted_by is None:
        return
    if _interrupted_by == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + _interrupted_by)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _interrupted_by
    if _interrupted_by is None:
        _interrupted_by = signum
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
