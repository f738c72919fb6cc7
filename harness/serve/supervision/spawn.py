"""Children that die with the harness: PR_SET_PDEATHSIG set between fork and exec, and every fork
done from a thread that lives as long as the harness (the signal follows the forking *thread*).

Linux only; elsewhere :data:`PDEATHSIG_SUPPORTED` is False and children are started plainly.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

__all__ = ["Launcher", "PDEATHSIG_SUPPORTED", "affinity_preexec", "call_from_long_lived_thread",
           "child_preexec", "pdeathsig_preexec"]

_T = TypeVar("_T")

_PR_SET_PDEATHSIG = 1
_libc_prctl: Any = None
if sys.platform.startswith("linux"):
    try:
        # Resolved here, not in the child: preexec_fn should do as little as possible after fork.
        _libc_prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - non-glibc oddities
        _libc_prctl = None


PDEATHSIG_SUPPORTED = _libc_prctl is not None


def pdeathsig_preexec(parent_pid: int, signum: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child get ``signum`` when ``parent_pid`` (the caller)
    dies."""
    def set_parent_death_signal() -> None:
        _libc_prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        # The parent may have died between fork() and prctl(); then no signal would ever come.
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signum)
    return set_parent_death_signal


class Launcher(Protocol):
    """Starts a child elsewhere than by exec (``template_client.ServerTemplate``: a fork of a
    warm interpreter) and returns what ``ManagedProcess`` uses of ``subprocess.Popen``."""

    def launch(self, argv: Sequence[str], env: Mapping[str, str], cwd: Any, log_path: Path,
               cores: Iterable[int] | None) -> Any: ...


def affinity_preexec(cores: frozenset[int]) -> Callable[[], None]:
    """A ``preexec_fn`` that confines the child, and every thread and process it will start,
    to ``cores`` (before exec: no thread of it exists yet)."""
    def pin() -> None:
        os.sched_setaffinity(0, cores)
    return pin


def child_preexec(pdeathsig_parent: int | None, announce: Callable[[], None] | None,
                  cpu_affinity: frozenset[int] | None = None,
                  pdeathsig_signal: int = signal.SIGTERM) -> Callable[[], None] | None:
    """The ``preexec_fn`` of a server: the parent-death signal ``pdeathsig_signal`` (when
    ``pdeathsig_parent`` is given: the caller's PID), its CPU cores (``cpu_affinity``), and then
    ``announce`` (the watchdog's registration of the new group); None when none is wanted."""
    parts = [part for part in (
        pdeathsig_preexec(pdeathsig_parent, pdeathsig_signal) if pdeathsig_parent is not None
        else None,
        affinity_preexec(cpu_affinity) if cpu_affinity else None,
        announce) if part is not None]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]

    def run_all() -> None:
        for part in parts:
            part()
    return run_all


class _SpawnerThread:
    """A long-lived thread that forks children started from short-lived threads.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process. A
    server started from a worker of a ``with ThreadPoolExecutor()`` block would get SIGTERM as
    soon as that block ended. Forking from the main thread, or from this daemon thread (which
    lives as long as the process), ties the signal to the harness process as intended.
    """

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]]
        self._requests = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[[], _T]) -> _T:
        if threading.current_thread() is threading.main_thread():
            return fn()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="pd-accuracy-spawner",
                                                daemon=True)
                self._thread.start()
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._requests.put((fn, future))
        return future.result()

    def _serve(self) -> None:
        while True:
            fn, future = self._requests.get()
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                future.set_exception(exc)


_SPAWNER = _SpawnerThread()


def call_from_long_lived_thread(fn: Callable[[], _T]) -> _T:
    """Run ``fn`` (which forks) on the main thread or the spawner thread and return its result."""
    return _SPAWNER.call(fn)
