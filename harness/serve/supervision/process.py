"""ManagedProcess: one server (vLLM, proxy, baseline) in its own process group, with its own log,
fail-fast health waiting, and a teardown that leaves nothing behind.

Why not mirakuru (read against mirakuru 3.1.0 in the venv): its ``SimpleExecutor`` can log to a
file, but (1) it overwrites ``preexec_fn`` with ``os.setsid``, so PR_SET_PDEATHSIG cannot be set;
(2) its ``stop()`` waits only for the group *leader* and then re-sends the *stop* signal to the
rest, so a group member that ignores SIGTERM survives once the leader has exited; and it raises
``ProcessFinishedWithError`` for any non-zero exit code but -SIGTERM, which is wrong in a teardown
path; (3) ``HTTPExecutor`` waits for readiness inside ``start()``, fails fast only on a non-zero
exit (a server exiting 0 is waited for until the timeout), and kills the server on timeout
without saying why. So this module wraps ``subprocess.Popen`` itself, in much the same shape.

Kills happen only by PGID (the group we created) or by PID of a descendant we saw ourselves,
verified through ``psutil.Process`` (which refuses a PID that has been reused). Never by name.

The parts around it have their own modules: ``spawn`` (PR_SET_PDEATHSIG and the forking thread),
``logscan`` (the decisive log lines), ``process_errors``, ``liveness`` (process-group checks) and
``process_registry`` (every live process of this interpreter, ``stop_all``, the signal handlers),
which also tells the ``watchdog`` (a harness killed by SIGKILL) and the host's ``process_ledger``
(a watchdog killed too) of every start and stop; their public names are importable from here.
"""
from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import psutil
import requests

from harness.core.redact import redact
from harness.serve.supervision import registry as process_registry
from harness.serve.host.liveness import is_zombie, process_create_time, process_group_alive
from harness.serve.launch.logscan import decisive_error_lines, most_decisive_line
from harness.serve.supervision.errors import (
    ManagedProcessError,
    ProcessStartError,
    ServerDiedError,
    ServerStartTimeout,
)
from harness.serve.supervision.registry import (
    install_signal_handlers,
    live_processes,
    peak_rss_bytes,
    stop_all,
    sweep_orphans,
    total_rss_bytes,
)
from harness.serve.supervision.memory import peak_rss_of, rss_of
from harness.serve.supervision.pause import pause_point
from harness.serve.supervision.spawn import (PDEATHSIG_SUPPORTED, Launcher, call_from_long_lived_thread,
                                  child_preexec)


LOG = logging.getLogger(__name__)
FORKED_UNREGISTERED = "forked-unregistered"   # a pause point (harness.serve.supervision.pause)

__all__ = [
    "ManagedProcess",
    "ManagedProcessError",
    "ProcessStartError",
    "ServerDiedError",
    "ServerStartTimeout",
    "decisive_error_lines",
    "most_decisive_line",
    "install_signal_handlers",
    "live_processes",
    "stop_all",
    "sweep_orphans",
    "process_group_alive",
    "total_rss_bytes",
    "peak_rss_bytes",
]


# ---------------------------------------------------------------------------------------------
# ManagedProcess
# ---------------------------------------------------------------------------------------------


class ManagedProcess:
    """One child process (a server) in its own session/process group, logging to its own file.

    ``env`` values are layered over ``os.environ`` (``inherit_env=True``) or used alone; a value
    of ``None`` removes that variable. ``PYTHONUNBUFFERED=1`` is set unless ``env`` says otherwise,
    so the log is current when the server dies. With ``pdeathsig=True`` (Linux) the child gets
    SIGTERM (``parent_death_signal``) if the harness dies, even by SIGKILL; the harness's
    ``watchdog`` then SIGKILLs what
    is left of its tree. Use as a context manager, or call ``start()`` and ``stop()``; every
    started process is also stopped by ``stop_all()`` and at exit.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: str | os.PathLike[str],
        env: Mapping[str, str | None] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        *,
        inherit_env: bool = True,
        pdeathsig: bool = True,
        parent_death_signal: int = signal.SIGTERM,
        cpu_affinity: Iterable[int] | None = None,
        template: Launcher | None = None,
    ) -> None:
        if not argv:
            raise ValueError(f"{name}: empty argv")
        self.name = name
        self.argv = [str(arg) for arg in argv]
        self.log_path = Path(log_path)
        self.env_overrides = dict(env or {})
        self.cwd = None if cwd is None else Path(cwd)
        self.inherit_env = inherit_env
        self.pdeathsig = pdeathsig and PDEATHSIG_SUPPORTED
        self.parent_death_signal = parent_death_signal   # what ``pdeathsig`` sends
        # the cores the child and all it starts may run on, set before exec (None: inherited)
        self.cpu_affinity = frozenset(cpu_affinity) if cpu_affinity else None
        # forked from a server template (vLLM imported already) instead of exec'd afresh
        self.template = template
        self._popen: subprocess.Popen[bytes] | None = None
        self._create_time: float | None = None
        self._log_offset = 0  # where this run's output starts in the (appended) log
        self._stopping = False
        self._stopping_thread: int | None = None
        # RLock: a signal handler may call stop() while this thread is inside stop() already
        self._stop_lock = threading.RLock()
        self._stopped = False
        # descendants seen so far: they may leave the group (setsid) or lose their parent
        self._seen_descendants: list[psutil.Process] = []

    # -- introspection -------------------------------------------------------------------------
    def command_line(self) -> str:
        """The command as a copy-pasteable shell line (for --dry-run and error messages)."""
        return shlex.join(self.argv)

    @property
    def pid(self) -> int | None:
        """PID of the direct child (also its PGID and SID); None before start()."""
        return None if self._popen is None else self._popen.pid

    @property
    def pgid(self) -> int | None:
        """Process-group id of the child's group (equal to its PID: it leads a new session)."""
        return self.pid

    @property
    def create_time(self) -> float | None:
        """``psutil`` create_time of the direct child (with the PID, what identifies it to the
        watchdog and the ledger); None before start() or if it exited at once."""
        return self._create_time

    @property
    def returncode(self) -> int | None:
        """Exit code of the direct child, negative for a signal; None while running."""
        return None if self._popen is None else self._popen.poll()

    def is_running(self) -> bool:
        """True while the direct child has not exited."""
        return self._popen is not None and self._popen.poll() is None

    def read_log(self) -> str:
        """This run's part of the log file (earlier runs appended to the same file excluded)."""
        try:
            with open(self.log_path, "rb") as log_file:
                log_file.seek(self._log_offset)
                return log_file.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def decisive_lines(self, limit: int = 5) -> list[str]:
        """``decisive_error_lines`` of this run's log."""
        return decisive_error_lines(self.read_log(), limit=limit)

    def build_env(self) -> dict[str, str]:
        """The exact environment the child gets."""
        merged = dict(os.environ) if self.inherit_env else {}
        merged.setdefault("PYTHONUNBUFFERED", "1")
        for key, value in self.env_overrides.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = str(value)
        return merged

    def __repr__(self) -> str:
        state = "not started" if self._popen is None else (
            f"pid={self.pid} running" if self.is_running() else f"pid={self.pid} rc={self.returncode}")
        return f"<ManagedProcess {self.name} {state}>"

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "ManagedProcess":
        """Start the child; returns self. Raises ProcessStartError if it cannot be executed."""
        if self._popen is not None:
            raise RuntimeError(f"{self.name} already started (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = self.build_env()
        with open(self.log_path, "a", buffering=1, encoding="utf-8") as log_file:
            log_file.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S')} start {self.name}: "
                           f"{redact(self.command_line())} (cwd: {self.cwd or os.getcwd()})\n")
            log_file.flush()
            self._log_offset = log_file.tell()
            announce = process_registry.prepare_start()
            if self.template is not None:
                log_file.close()
                try:
                    self._popen = self.template.launch(  # type: ignore[assignment]
                        self.argv, env, self.cwd, self.log_path, self.cpu_affinity)
                except (OSError, ValueError, ManagedProcessError) as exc:
                    raise ProcessStartError(self.name, str(exc), self.log_path) from exc
                # kill phase 3 (forked, not yet registered): held open only for its test
                pause_point(FORKED_UNREGISTERED, f"{self.name} pid={self._popen.pid}",
                            lambda: process_registry.interrupted_by() is not None)
                return self._started()
            preexec = child_preexec(os.getpid() if self.pdeathsig else None,
                                    announce, self.cpu_affinity, self.parent_death_signal)

            def spawn() -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    self.argv, env=env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                    stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=preexec, close_fds=True,
                )

            try:
                self._popen = call_from_long_lived_thread(spawn)
            except (OSError, subprocess.SubprocessError) as exc:
                log_file.write(f"=== could not start {self.name}: {exc}\n")
                raise ProcessStartError(self.name, str(exc), self.log_path) from exc
        return self._started()

    def _started(self) -> "ManagedProcess":
        assert self._popen is not None
        self._create_time = process_create_time(self._popen.pid)
        process_registry.register(self)
        LOG.info("started %s pid=%s: %s (log: %s)", self.name, self.pid, redact(self.command_line()),
                 self.log_path)
        return self

    def wait_healthy(self, url: str, deadline_s: float, poll_s: float = 0.5,
                     request_timeout_s: float = 5.0) -> None:
        """Poll ``url`` with GET until it answers 200.

        Raises ServerDiedError as soon as the process exits (any exit code, 0 included), and
        ServerStartTimeout after ``deadline_s``; the process is left running in that case, for
        the caller to inspect and stop() (the context manager and stop_all() do).
        """
        if self._popen is None:
            raise RuntimeError(f"{self.name} was not started")
        deadline = time.monotonic() + deadline_s
        with requests.Session() as session:
            session.trust_env = False  # an http_proxy setting must not intercept local servers
            while True:
                self._raise_if_died()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ServerStartTimeout(self.name, deadline_s, self.log_path,
                                             self.decisive_lines())
                try:
                    response = session.get(url, timeout=max(0.05, min(request_timeout_s, remaining)))
                    if response.status_code == 200:
                        return
                except requests.RequestException:
                    pass
                self._raise_if_died()
                time.sleep(max(0.0, min(poll_s, deadline - time.monotonic())))

    def _raise_if_died(self) -> None:
        assert self._popen is not None
        returncode = self._popen.poll()
        if returncode is not None:
            raise ServerDiedError(self.name, returncode, self.log_path, self.decisive_lines())

    def _descendants(self) -> list[psutil.Process]:
        """Every descendant seen so far (a snapshot now, added to the earlier ones)."""
        if self._popen is not None and self._popen.poll() is None:
            try:
                current = psutil.Process(self._popen.pid).children(recursive=True)
            except psutil.Error:
                current = []
            self._seen_descendants += [p for p in current if p not in self._seen_descendants]
        return list(self._seen_descendants)

    def _signal_group(self, signum: int, strays: Iterable[psutil.Process] = ()) -> None:
        """Send ``signum`` to our process group and to descendants that left it (setsid)."""
        assert self._popen is not None
        try:
            os.killpg(self._popen.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass  # group already empty (PermissionError: a zombie-only group on some kernels)
        for proc in strays:
            try:
                # psutil.Process.send_signal refuses a PID that was reused by another process.
                if os.getpgid(proc.pid) != self._popen.pid:
                    proc.send_signal(signum)
            except (ProcessLookupError, psutil.Error):
                pass

    def _tree_alive(self, strays: Iterable[psutil.Process]) -> bool:
        assert self._popen is not None
        if self._popen.poll() is None:
            return True
        if process_group_alive(self._popen.pid):
            return True
        return any(proc.is_running() and not is_zombie(proc) for proc in strays)

    def signal_term(self) -> None:
        """SIGTERM the whole tree now without waiting (no-op once stopped): ``stop_all`` does this
        to every process first, so they all use the grace period at the same time."""
        if self._popen is not None and not self._stopped:
            self._signal_group(signal.SIGTERM, self._descendants())

    def stop(self, term_timeout_s: float = 15.0) -> int | None:
        """SIGTERM the whole process group, wait up to ``term_timeout_s`` for every member to
        exit, then SIGKILL the group; reap the child. Idempotent and safe on a dead process.
        Returns the child's exit code (None if it was never started).

        Called again while a stop is in progress (a signal handler interrupting stop()), it
        escalates to SIGKILL at once and returns without waiting.
        """
        if self._popen is None:
            return None
        if self._stopping and self._stopping_thread == threading.get_ident():
            self._signal_group(signal.SIGKILL, self._descendants())
            return self._popen.poll()
        with self._stop_lock:  # another thread stopping it: wait for that stop to finish
            if self._stopped:
                return self._popen.returncode
            return self._stop_locked(term_timeout_s)

    def _stop_locked(self, term_timeout_s: float) -> int | None:
        assert self._popen is not None
        self._stopping, self._stopping_thread = True, threading.get_ident()
        try:
            strays = self._descendants()
            self._signal_group(signal.SIGTERM, strays)
            deadline = time.monotonic() + max(0.0, term_timeout_s)
            while self._tree_alive(strays) and time.monotonic() < deadline:
                strays = self._descendants()
                time.sleep(0.05)
            if self._tree_alive(strays):
                LOG.warning("%s (pgid %s) still alive %gs after SIGTERM; sending SIGKILL",
                            self.name, self._popen.pid, term_timeout_s)
                strays = self._descendants()
                self._signal_group(signal.SIGKILL, strays)
            try:
                self._popen.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - stuck in uninterruptible sleep
                LOG.error("%s (pid %s) did not die after SIGKILL", self.name, self._popen.pid)
                return None
            # SIGKILL is not instantaneous for the other members; give them a moment to vanish.
            settle_deadline = time.monotonic() + 5
            while self._tree_alive(strays) and time.monotonic() < settle_deadline:
                self._signal_group(signal.SIGKILL, strays)
                time.sleep(0.02)
            self._stopped = True
            LOG.info("stopped %s pid=%s rc=%s", self.name, self._popen.pid, self._popen.returncode)
            return self._popen.returncode
        finally:
            self._stopping, self._stopping_thread = False, None
            if self._stopped:
                process_registry.unregister(self)

    def kill(self) -> int | None:
        """SIGKILL the whole group now and reap (stop() with no grace period)."""
        return self.stop(term_timeout_s=0)

    def __enter__(self) -> "ManagedProcess":
        if self._popen is None:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- memory --------------------------------------------------------------------------------
    def _tree(self) -> list[psutil.Process]:
        if self._popen is None or self._popen.poll() is not None:
            return []
        try:
            leader = psutil.Process(self._popen.pid)
            return [leader, *leader.children(recursive=True)]
        except psutil.Error:
            return []

    def rss_bytes(self) -> int:
        """Current RSS summed over the process tree (the child and all its descendants).
        Shared pages (e.g. torch libraries mapped by every worker) are counted once per process."""
        return sum(rss_of(proc) for proc in self._tree())

    def peak_rss_bytes(self) -> int:
        """Sum over the live tree of each process's own RSS high-water mark (Linux VmHWM).
        An upper bound of the tree's simultaneous peak; processes that already exited are
        not counted."""
        return sum(peak_rss_of(proc) for proc in self._tree())

