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
"""
from __future__ import annotations

import atexit
import concurrent.futures
import ctypes
import ctypes.util
import logging
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TypeVar

import psutil
import requests

LOG = logging.getLogger(__name__)

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
    "process_group_alive",
    "total_rss_bytes",
    "peak_rss_bytes",
]

_T = TypeVar("_T")

# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class ManagedProcessError(RuntimeError):
    """Base of the errors a managed server raises; each carries its name, log and decisive lines."""

    name: str
    log_path: str
    decisive_lines: list[str]

    @property
    def decisive_line(self) -> str:
        """The one log line that best explains the failure ('' when the log is empty)."""
        return most_decisive_line(self.decisive_lines)


class ServerDiedError(ManagedProcessError):
    """The process exited before its health URL answered 200."""

    def __init__(self, name: str, returncode: int, log_path: str | os.PathLike[str],
                 decisive_lines: Sequence[str]) -> None:
        # args are exactly the constructor's parameters, so the exception pickles (xdist, mp)
        super().__init__(name, returncode, str(log_path), list(decisive_lines))
        self.name, self.returncode = name, returncode
        self.log_path, self.decisive_lines = str(log_path), list(decisive_lines)

    def __str__(self) -> str:
        code = str(self.returncode)
        if self.returncode < 0:
            try:
                code += f" ({signal.Signals(-self.returncode).name})"
            except ValueError:
                pass
        return (f"{self.name} exited with code {code} before becoming healthy: "
                f"{self.decisive_line or '(empty log)'} (log: {self.log_path})")


class ServerStartTimeout(ManagedProcessError):
    """The process was still running but not healthy when the deadline passed."""

    def __init__(self, name: str, deadline_s: float, log_path: str | os.PathLike[str],
                 decisive_lines: Sequence[str]) -> None:
        super().__init__(name, deadline_s, str(log_path), list(decisive_lines))
        self.name, self.deadline_s = name, deadline_s
        self.log_path, self.decisive_lines = str(log_path), list(decisive_lines)

    def __str__(self) -> str:
        return (f"{self.name} was not healthy after {self.deadline_s:g}s: "
                f"{self.decisive_line or '(empty log)'} (log: {self.log_path})")


class ProcessStartError(ManagedProcessError):
    """The executable could not be started at all (missing binary, bad cwd, ...)."""

    def __init__(self, name: str, reason: str, log_path: str | os.PathLike[str]) -> None:
        super().__init__(name, reason, str(log_path))
        self.name, self.reason = name, reason
        self.log_path, self.decisive_lines = str(log_path), [reason]

    def __str__(self) -> str:
        return f"{self.name} could not be started: {self.reason} (log: {self.log_path})"


# ---------------------------------------------------------------------------------------------
# Decisive log lines
# ---------------------------------------------------------------------------------------------

# vLLM prefixes lines of its child processes, e.g. "(EngineCore_DP0 pid=1234) ERROR ...".
_PROCESS_PREFIX_RE = re.compile(r"^\([^()]*\bpid=\d+\)\s?")
# Routine log records: an INFO line that mentions NIXL or "error_rate" is not a failure. Covers
# vLLM ("INFO 11-29 19:22:01 [x.py:1] ..."), NIXL's Python logger ("2026-11-29 19:22:01 NIXL INFO
# ...") and glog-style C++ lines ("I1129 19:22:01.123 ...").
_ROUTINE_LEVEL_RE = re.compile(r"^.{0,64}?\b(?:INFO|DEBUG|TRACE)\b|^[ID]\d{4} \d\d:\d\d:\d\d")
# Lines that look like errors but are known to be harmless, logged by every healthy start of vLLM
# 0.26 on the offline H200: NIXL's optional expert-parallel extension, FlashInfer's cubin download,
# the fd-limit notice. Never decisive: a server that times out in start-up is then described by
# its last log lines (where it was), not by one of these.
_HARMLESS_RE = re.compile(
    r"No module named 'nixl_ep|Module nixl_ep was found but failed to import"
    r"|Failed to connect to NVIDIA artifactory|Found ulimit of \d+ and failed to automatically")
_ERROR_LOOKING_RE = re.compile(
    r"Error|Exception|CUDA out of memory|NIXL|\bERROR\b|\bCRITICAL\b|\bFATAL\b|\berror:"
    r"|Segmentation fault|core dumped|Killed\b|Aborted\b|^[EF]\d{4} \d\d:\d\d:\d\d"
)
# Wrapper messages that only point elsewhere; the line that *caused* them is more decisive.
_GENERIC_WRAPPER_RE = re.compile(
    r"See root cause above|See stack trace \(above\)|Engine core initialization failed"
    r"|initialization failed\.?$|^=== |output_handler failed|EngineDeadError"
    r"|^SystemExit\b|^KeyboardInterrupt\b"
)


# What a C++ abort prints after the real error (std::terminate boilerplate, c10's "Exception
# raised from <destructor>" trailer, CUDA's advice lines): on the H200 a TP2 worker's CUBLAS
# failure ended in six such lines that pushed the cause out of the last five.
_ABORT_TRAILER_RE = re.compile(
    r"^terminate called after throwing|^\s*what\(\):|^Search for `cuda"
    r"|^Exception raised from \S+ at |^CUDA kernel errors might be asynchronously reported"
    r"|^For debugging consider passing CUDA_LAUNCH_BLOCKING|^Compile with `TORCH_USE_CUDA_DSA`"
)
# vLLM's own statement of a worker's root cause; when present it is the line to show.
_ROOT_CAUSE_RE = re.compile(r"Worker failed with error ")


def _strip_process_prefix(line: str) -> str:
    return _PROCESS_PREFIX_RE.sub("", line, count=1)


# vLLM logs a traceback one record per line ("ERROR 11-29 21:11:59 [core.py:1332]   File ...");
# strip that record prefix so the traceback logic below sees the plain lines.
_VLLM_RECORD_PREFIX_RE = re.compile(
    r"^(?:ERROR|WARNING|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]+\] ?")
_STACK_NOISE_RE = re.compile(r"^\s*(?:frame #\d+:|File \"|\^+\s*$)")


def decisive_error_lines(log_text: str, limit: int = 5) -> list[str]:
    """Return the last ``limit`` error-looking lines of a server log, in log order.

    Error-looking: the final line of each Python traceback (``KeyError: 'x'``), and any line that
    is not a routine INFO/DEBUG record and mentions Error, Exception, ERROR, ``error:`` (argparse),
    "CUDA out of memory", NIXL, FATAL/CRITICAL, or a fatal signal. Repeated identical lines (the
    same error printed by every worker) count once. When nothing looks like an error, the last 10
    non-empty lines are returned instead, so a caller always has something to show.
    """
    raw_lines = [line.rstrip() for line in log_text.splitlines()]
    picked: list[str] = []
    in_traceback = False
    for raw in raw_lines:
        plain = _strip_process_prefix(raw)
        body = _VLLM_RECORD_PREFIX_RE.sub("", plain, count=1)
        if not body.strip() or _STACK_NOISE_RE.match(body):
            continue  # C++ frames ("frame #3: ...") and traceback frames logged line by line
        if body.startswith("Traceback (most recent call last):"):
            in_traceback = True
            continue
        if in_traceback:
            if body[:1].isspace():
                continue  # a frame ("  File ...") or its source line
            in_traceback = False
            if not _HARMLESS_RE.search(body):
                picked.append(raw)  # the exception line that ends the traceback
            continue
        if (_ROUTINE_LEVEL_RE.match(plain) or _HARMLESS_RE.search(plain)
                or _ABORT_TRAILER_RE.match(body)):
            continue
        if _ERROR_LOOKING_RE.search(plain):
            picked.append(raw)
    if not picked:
        return [line for line in raw_lines if line.strip()][-10:]
    # Dedupe by content (ignoring the per-process prefix), keeping each line's last occurrence.
    last_index = {_strip_process_prefix(line): i for i, line in enumerate(picked)}
    unique = [line for i, line in enumerate(picked) if last_index[_strip_process_prefix(line)] == i]
    return unique[-limit:] if limit > 0 else []


def most_decisive_line(lines: Sequence[str]) -> str:
    """Pick the single line to show in a one-line error: vLLM's "Worker failed with error ..."
    when present (what came after it is the workers' teardown), else the last line that is not a
    generic wrapper such as vLLM's "Engine core initialization failed. See root cause above."."""
    for line in reversed(lines):
        if _ROOT_CAUSE_RE.search(line):
            return line.strip()
    for line in reversed(lines):
        if not _GENERIC_WRAPPER_RE.search(_strip_process_prefix(line).strip()):
            return line.strip()
    return lines[-1].strip() if lines else ""


# ---------------------------------------------------------------------------------------------
# Parent-death signal
# ---------------------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
_libc_prctl: Any = None
if sys.platform.startswith("linux"):
    try:
        # Resolved here, not in the child: preexec_fn should do as little as possible after fork.
        _libc_prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - non-glibc oddities
        _libc_prctl = None


def _pdeathsig_preexec(parent_pid: int) -> Callable[[], None]:
    def set_parent_death_signal() -> None:
        _libc_prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        # The parent may have died between fork() and prctl(); then no signal would ever come.
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGTERM)
    return set_parent_death_signal


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

# ---------------------------------------------------------------------------------------------
# Process-group helpers
# ---------------------------------------------------------------------------------------------


def _is_zombie(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
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
            if os.getpgid(proc.pid) == pgid and not _is_zombie(proc):
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def _rss_of(proc: psutil.Process) -> int:
    try:
        return 0 if _is_zombie(proc) else proc.memory_info().rss
    except psutil.Error:
        return 0


def _peak_rss_of(proc: psutil.Process) -> int:
    # VmHWM is the kernel's own high-water mark of this process's RSS; no sampling needed.
    try:
        with open(f"/proc/{proc.pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return _rss_of(proc)


# ---------------------------------------------------------------------------------------------
# ManagedProcess
# ---------------------------------------------------------------------------------------------

_REGISTRY: dict[int, "ManagedProcess"] = {}
# RLock: a signal handler runs on the main thread and may need it while the main thread holds it.
_REGISTRY_LOCK = threading.RLock()


class ManagedProcess:
    """One child process (a server) in its own session/process group, logging to its own file.

    ``env`` values are layered over ``os.environ`` (``inherit_env=True``) or used alone; a value
    of ``None`` removes that variable. ``PYTHONUNBUFFERED=1`` is set unless ``env`` says otherwise,
    so the log is current when the server dies. With ``pdeathsig=True`` (Linux) the child gets
    SIGTERM if the harness dies, even by SIGKILL. Use as a context manager, or call ``start()``
    and ``stop()``; every started process is also stopped by ``stop_all()`` and at exit.
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
    ) -> None:
        if not argv:
            raise ValueError(f"{name}: empty argv")
        self.name = name
        self.argv = [str(arg) for arg in argv]
        self.log_path = Path(log_path)
        self.env_overrides = dict(env or {})
        self.cwd = None if cwd is None else Path(cwd)
        self.inherit_env = inherit_env
        self.pdeathsig = pdeathsig and _libc_prctl is not None
        self._popen: subprocess.Popen[bytes] | None = None
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
                           f"{self.command_line()} (cwd: {self.cwd or os.getcwd()})\n")
            log_file.flush()
            self._log_offset = log_file.tell()
            preexec = _pdeathsig_preexec(os.getpid()) if self.pdeathsig else None

            def spawn() -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    self.argv, env=env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                    stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=preexec, close_fds=True,
                )

            try:
                self._popen = _SPAWNER.call(spawn)
            except (OSError, subprocess.SubprocessError) as exc:
                log_file.write(f"=== could not start {self.name}: {exc}\n")
                raise ProcessStartError(self.name, str(exc), self.log_path) from exc
        with _REGISTRY_LOCK:
            _REGISTRY[id(self)] = self
        LOG.info("started %s pid=%s: %s (log: %s)", self.name, self.pid, self.command_line(),
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
        return any(proc.is_running() and not _is_zombie(proc) for proc in strays)

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
                with _REGISTRY_LOCK:
                    _REGISTRY.pop(id(self), None)

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
        return sum(_rss_of(proc) for proc in self._tree())

    def peak_rss_bytes(self) -> int:
        """Sum over the live tree of each process's own RSS high-water mark (Linux VmHWM).
        An upper bound of the tree's simultaneous peak; processes that already exited are
        not counted."""
        return sum(_peak_rss_of(proc) for proc in self._tree())


# ---------------------------------------------------------------------------------------------
# Registry, atexit and signals
# ---------------------------------------------------------------------------------------------


def live_processes() -> list[ManagedProcess]:
    """Every ManagedProcess started in this interpreter and not yet stopped."""
    with _REGISTRY_LOCK:
        return list(_REGISTRY.values())


def total_rss_bytes(processes: Iterable[ManagedProcess] | None = None) -> int:
    """Current RSS of the given processes' trees (default: all live ones), summed."""
    return sum(p.rss_bytes() for p in (live_processes() if processes is None else processes))


def peak_rss_bytes(processes: Iterable[ManagedProcess] | None = None) -> int:
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
            if process._popen is not None and not process._stopped:
                process._signal_group(signal.SIGTERM, process._descendants())
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
