"""The watchdog: a tiny process that takes every server down when its harness dies, however it
dies (SIGKILL, OOM killer, a crash in C code), and then exits.

PR_SET_PDEATHSIG reaches only the API server, with SIGTERM, and a vLLM server still in start-up
(engine init, compile warm-up) does not act on it; its EngineCore and Workers never get anything.
So each harness process starts one watchdog (lazily, on its first server) connected by a socket:
the harness sends the PGID of every group it starts (``+``) and stops (``-``). When the socket
reaches EOF (which the kernel delivers when the harness is gone) or the watchdog's parent
changes, the watchdog SIGTERMs every group still registered, waits a short grace, SIGKILLs what
is left, and exits; after a normal run nothing is registered any more and it exits at once.

Every second it also records the descendants of each registered leader (``process_groups``): a
process that left its group, or whose parent died, is still killed by its (pid, create_time).
The watchdog runs in a session of its own, so nothing sent to the harness's process group or
terminal reaches it, and it holds no file of the harness but its stderr (its report goes there).

A child announces itself from ``preexec_fn`` (before exec) through the same socket, so a
harness killed between fork and its own ``+`` line leaves no server unregistered.
"""
from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from harness.core.process_wide import ProcessWide
from harness.serve.host.liveness import CREATE_TIME_TOLERANCE_S, process_create_time
from harness.serve.supervision.groups import TrackedGroup, process_table, terminate_groups

LOG = logging.getLogger(__name__)

__all__ = ["DEFAULT_GRACE_S", "WATCHDOG_SUPPORTED", "Watchdog", "default_watchdog", "main"]

DEFAULT_GRACE_S = 3.0
DEFAULT_POLL_S = 1.0
WATCHDOG_SUPPORTED = os.name == "posix" and hasattr(socket, "MSG_NOSIGNAL")
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)  # a dead watchdog gives EPIPE, never SIGPIPE
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# The harness's side
# ---------------------------------------------------------------------------------------------


class Watchdog:
    """The harness's handle on its watchdog process: started on first use, restarted (with every
    registered group sent again) if it died, and replaced in a forked child of the harness."""

    def __init__(self, grace_s: float = DEFAULT_GRACE_S, poll_s: float = DEFAULT_POLL_S) -> None:
        self.grace_s, self.poll_s = grace_s, poll_s
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._owner_pid: int | None = None
        self._watched: dict[int, str] = {}  # pgid -> its "+" line
        self._failed = False

    @property
    def pid(self) -> int | None:
        """PID of the watchdog process (None before the first server or once closed)."""
        with self._lock:
            return None if self._process is None else self._process.pid

    def announcer(self) -> Callable[[], None] | None:
        """Start the watchdog if it does not run; return a function for a child's ``preexec_fn``
        that registers the child's group (it leads a new session: PGID = PID). None when there
        is no watchdog (unsupported platform, or it could not be started)."""
        with self._lock:
            sock = self._ensure_running()
        if sock is None:
            return None

        def announce() -> None:
            try:
                sock.send(b"+ %d - child\n" % os.getpid(), _SEND_FLAGS)
            except OSError:
                pass  # no watchdog: the child starts anyway, as it did before there was one
        return announce

    def watch(self, pgid: int, create_time: float | None, name: str) -> None:
        """Register a started group; its leader's create_time guards against a reused PID."""
        line = f"+ {pgid} {'-' if create_time is None else repr(create_time)} {_one_line(name)}\n"
        with self._lock:
            self._watched[pgid] = line
            if self._ensure_running() is not None and not self._send(line):
                self._restart()

    def unwatch(self, pgid: int) -> None:
        """Forget a stopped group (nothing of it is left to kill)."""
        with self._lock:
            self._watched.pop(pgid, None)
            if self._sock is not None and self._owner_pid == os.getpid():
                self._send(f"- {pgid}\n")

    def close(self, wait_s: float = 1.0) -> None:
        """Close the socket: the watchdog cleans up what is still registered and exits. Waits up
        to ``wait_s`` for it (to reap it); it finishes on its own after that."""
        with self._lock:
            sock, process = self._sock, self._process
            if self._owner_pid != os.getpid():
                process = None  # a forked child's copy: the process is its parent's to reap
            self._sock, self._process, self._owner_pid = None, None, None
        if sock is not None:
            sock.close()
        if process is not None:
            try:
                process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                pass

    # -- internals (called with self._lock held) --------------------------------------------------
    def _ensure_running(self) -> socket.socket | None:
        if not WATCHDOG_SUPPORTED:
            return None
        if self._owner_pid is not None and self._owner_pid != os.getpid():
            self._forget_inherited()
        if self._sock is not None and self._process is not None and self._process.poll() is None:
            return self._sock
        if self._sock is not None:
            LOG.warning("watchdog (pid %s) exited with %s; starting a new one",
                        self._process.pid if self._process else None,
                        self._process.returncode if self._process else None)
        return self._start()

    def _forget_inherited(self) -> None:
        # A forked child of the harness: the socket and the process are its parent's. Closing
        # our copy of the socket keeps the parent's EOF intact; the child gets its own watchdog.
        if self._sock is not None:
            self._sock.close()
        self._sock, self._process, self._owner_pid = None, None, None
        self._watched.clear()

    def _start(self) -> socket.socket | None:
        if self._sock is not None:
            self._sock.close()
        self._sock = self._process = None
        ours, theirs = socket.socketpair()  # both ends close-on-exec: no server inherits them
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT),
                                                          env.get("PYTHONPATH")]))
        argv = [sys.executable, "-m", "harness.serve.supervision.watchdog", str(os.getpid()),
                str(self.grace_s), str(self.poll_s)]
        try:
            with theirs:
                self._process = subprocess.Popen(
                    argv, stdin=theirs.fileno(), stdout=subprocess.DEVNULL, env=env, cwd="/",
                    start_new_session=True, close_fds=True)
        except OSError as exc:
            ours.close()
            if not self._failed:
                LOG.warning("could not start the watchdog (%s): servers may outlive a killed "
                            "harness", exc)
            self._failed = True
            return None
        self._sock, self._owner_pid = ours, os.getpid()
        for line in self._watched.values():
            self._send(line)
        return self._sock

    def _restart(self) -> None:
        if self._start() is None:
            LOG.warning("no watchdog: servers may outlive a killed harness")

    def _send(self, line: str) -> bool:
        assert self._sock is not None
        try:
            self._sock.sendall(line.encode("utf-8", errors="replace"), _SEND_FLAGS)
            return True
        except OSError:
            return False


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "-"


default_watchdog = ProcessWide(Watchdog, "The watchdog of this harness process (one per process).")


# ---------------------------------------------------------------------------------------------
# The watchdog process
# ---------------------------------------------------------------------------------------------


def _say(message: str) -> None:
    try:
        print(f"pd-accuracy watchdog (pid {os.getpid()}): {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # whoever read the harness's stderr is gone too: the cleanup matters, not the report


class _Watch:
    """The watchdog's state: the registered groups, fed by the harness's lines."""

    def __init__(self) -> None:
        self.groups: dict[int, TrackedGroup] = {}

    def apply(self, line: str) -> None:
        parts = line.split(" ", 3)
        try:
            if parts[0] == "+" and len(parts) >= 2:
                pgid = int(parts[1])
                created = None if len(parts) < 3 or parts[2] == "-" else float(parts[2])
                name = parts[3] if len(parts) > 3 else ""
                self._add(pgid, created, name)
            elif parts[0] == "-" and len(parts) >= 2:
                self.groups.pop(int(parts[1]), None)
        except ValueError:
            _say(f"ignoring malformed line {line!r}")

    def _add(self, pgid: int, created: float | None, name: str) -> None:
        if created is None:  # a child announcing itself: it runs (in preexec_fn) right now
            created = process_create_time(pgid)
        group = self.groups.get(pgid)
        if group is None or None not in (created, group.leader_create_time) and \
                abs(created - group.leader_create_time) >= CREATE_TIME_TOLERANCE_S:
            # new, or the PID of a group never unwatched went to this one: the harness knows best
            group = self.groups[pgid] = TrackedGroup(pgid, created, name)
        if created is not None and group.leader_create_time is None:
            group.leader_create_time = created
        if name and name != "child":
            group.name = name

    def refresh(self) -> None:
        table = process_table()
        for pgid, group in list(self.groups.items()):
            if group.leader_create_time is None and pgid not in table.create_time:
                del self.groups[pgid]  # died before we ever saw it run (exec failed): nothing
                continue               # of it to stop, and its PID may be reused
            group.remember_descendants(table)


def _read(conn: socket.socket, state: _Watch, pending: bytes) -> tuple[bytes, bool | None]:
    """Take in what the harness sent: (the unfinished rest, False), (.., True) at EOF, or
    (.., None) when nothing was there (a non-blocking socket)."""
    try:
        data = conn.recv(65536)
    except BlockingIOError:
        return pending, None
    except OSError:
        data = b""
    if not data:
        return pending, True
    *lines, pending = (pending + data).split(b"\n")
    for line in lines:
        state.apply(line.decode("utf-8", errors="replace"))
    return pending, False


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.serve.supervision.watchdog HARNESS_PID GRACE_S [POLL_S]``, the socket on stdin."""
    args = sys.argv[1:] if argv is None else argv
    harness_pid, grace_s = int(args[0]), float(args[1])
    poll_s = float(args[2]) if len(args) > 2 else DEFAULT_POLL_S
    for signum in (signal.SIGINT, signal.SIGHUP):  # no terminal of ours; only EOF ends the watch
        signal.signal(signum, signal.SIG_IGN)
    conn = socket.socket(fileno=0)
    state, pending, eof = _Watch(), b"", False
    why, refreshed_at = "its socket closed", 0.0
    while not eof:
        if select.select([conn], [], [], poll_s)[0]:
            pending, eof = _read(conn, state, pending)
        if not eof and os.getppid() != harness_pid:
            # someone else still holds the socket (a forked child of the harness): the parent
            # is what matters. Take in what it sent last, then clean up.
            why = "it was re-parented"
            conn.setblocking(False)
            got: bool | None = False
            while got is False:
                pending, got = _read(conn, state, pending)
            break
        if state.groups and time.monotonic() - refreshed_at >= poll_s:
            state.refresh()
            refreshed_at = time.monotonic()
    if state.groups:
        state.refresh()  # the last descendants, and drop what never ran
    if not state.groups:
        return 0  # a normal end: every server was stopped
    names = ", ".join(f"{g.name or 'group'} (pgid {g.pgid})" for g in state.groups.values())
    _say(f"harness pid {harness_pid} is gone ({why}); stopping {names}")
    left = terminate_groups(state.groups.values(), grace_s, say=_say)
    if left:
        _say(f"still alive after SIGKILL: {sorted(left)}")
        return 1
    _say("all gone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
