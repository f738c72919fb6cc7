"""The harness's side of the server template (``harness.serve.template.server``): starts the
template once per Python executable, asks it for each server, and hands ``ManagedProcess`` a
handle that looks like the ``subprocess.Popen`` it would otherwise hold.

A forked server is the template's child, not the harness's: :class:`ForkedServer` learns of its
end from the exit status the template writes when it reaps it (``rc_path``), and otherwise from
the PID and its create time (a PID the kernel reused is not taken for the server).

A template's folder (its socket, the servers' ``.rc`` files) lies in this user's host state
directory, ``templates/<harness pid>-*``; it is removed when the template stops and at exit,
and a folder whose harness is gone (SIGKILL) by the next template made on the host.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import psutil

from harness.serve.host.liveness import is_zombie, process_create_time
from harness.serve.host.store import default_state_dir, owned_dir
from harness.serve.supervision.errors import ProcessStartError
from harness.serve.template.server import HARNESS_GONE, READY_LINE, SERVER_MODULE, read_json_line

TEMPLATE_MODULE = "harness.serve.template.server"
TEMPLATE_START_TIMEOUT_S = 600.0

__all__ = ["ForkedServer", "ServerTemplate", "new_template_dir", "stop_templates",
           "sweep_template_dirs", "template_for"]


def sweep_template_dirs(base: Path) -> list[Path]:
    """Remove the template folders under ``base`` whose harness (the pid in the name) is gone."""
    removed = []
    for folder in base.iterdir():
        pid = folder.name.split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def new_template_dir() -> Path:
    """A fresh ``templates/<pid>-*`` folder of this user's (stale ones swept first), removed
    at exit."""
    base = owned_dir(default_state_dir() / "templates")
    sweep_template_dirs(base)
    folder = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=base))
    atexit.register(shutil.rmtree, folder, True)
    return folder


class ForkedServer:
    """What ``ManagedProcess`` uses of ``subprocess.Popen``, for a server the template forked."""

    def __init__(self, pid: int, rc_path: Path) -> None:
        self.pid = pid
        self.rc_path = rc_path
        self.returncode: int | None = None
        self._create_time = process_create_time(pid)

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        try:
            self.returncode = int(self.rc_path.read_text())
            return self.returncode
        except (FileNotFoundError, ValueError):
            pass
        try:
            proc = psutil.Process(self.pid)
            if self._create_time is not None and \
                    process_create_time(self.pid) not in (None, self._create_time):
                raise psutil.NoSuchProcess(self.pid)
            if not is_zombie(proc):
                return None
        except psutil.NoSuchProcess:
            pass
        # gone (or a zombie) and no status yet: the template reaps within 0.2 s of its loop
        time.sleep(0.5)
        try:
            self.returncode = int(self.rc_path.read_text())
        except (FileNotFoundError, ValueError):
            self.returncode = -9   # the template died first: nobody reaped it to tell
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode


class ServerTemplate:
    """One template process (vLLM imported once) for servers run by ``python`` on ``cores``.

    The template runs on the cores of its servers: what torch and OpenMP size at import (the
    intra-op threads: the CPUs the process may use) is then what an exec'd server pinned to
    those cores sizes. Measured: forks of one unpinned template on the 2-core machine inherited
    2 threads ("Reducing Torch threads from 2 to 1" in the engine core) and the baseline then
    answered one question in ~10 s at concurrency 1, against well under 1 s exec'd."""

    def __init__(self, python: str, log_dir: Path, cores: Iterable[int] | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        from harness.serve.supervision.process import ManagedProcess   # process imports this module

        self.python = python
        self.cores = frozenset(cores) if cores else None
        self.dir = new_template_dir()
        self.socket_path = self.dir / "template.sock"
        base = dict(os.environ if env is None else env)
        base.update({"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        tag = "-cores-" + "-".join(map(str, sorted(self.cores))) if self.cores else ""
        self.process = ManagedProcess(
            f"server-template{tag}", [python, "-m", TEMPLATE_MODULE, str(self.socket_path)],
            Path(log_dir) / f"server-template{tag}.log", env=base, inherit_env=False,
            cpu_affinity=self.cores, parent_death_signal=HARNESS_GONE)
        self._lock = threading.Lock()
        self._started = False
        self._count = 0

    def start(self, timeout_s: float = TEMPLATE_START_TIMEOUT_S) -> "ServerTemplate":
        """Start the template and wait until it has imported vLLM and listens (idempotent)."""
        with self._lock:
            if self._started:
                return self
            try:
                self._wait_ready(timeout_s)
            except BaseException:   # failed, timed out, interrupted: no process, no folder left
                self.stop()
                raise
            self._started = True
            return self

    def _wait_ready(self, timeout_s: float) -> None:
        self.process.start()
        deadline = time.monotonic() + timeout_s
        while READY_LINE not in self.process.read_log():
            if not self.process.is_running():
                raise ProcessStartError("server-template", "exited before it was ready: "
                                        + " | ".join(self.process.decisive_lines()),
                                        self.process.log_path)
            if time.monotonic() > deadline:
                raise ProcessStartError("server-template", f"not ready in {timeout_s:.0f} s",
                                        self.process.log_path)
            time.sleep(0.1)

    def can_run(self, argv: Sequence[str]) -> bool:
        """Whether ``argv`` is a plain API server launch by this template's Python."""
        return list(argv[:3]) == [self.python, "-m", SERVER_MODULE]

    def launch(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | os.PathLike | None,
               log_path: Path, cores: Iterable[int] | None) -> ForkedServer:
        """Fork a server that runs ``argv`` (``python -m vllm.entrypoints.openai.api_server
        ARGS``) with ``env``, ``cwd``, output appended to ``log_path``, on ``cores`` (this
        template's)."""
        if not self.can_run(argv):
            raise ValueError(f"not a server this template runs: {list(argv[:3])}")
        if (frozenset(cores) if cores else None) != self.cores:
            raise ValueError(f"a server on cores {sorted(cores or ())} from the template of "
                             f"cores {sorted(self.cores or ())}")
        self.start()
        with self._lock:
            self._count += 1
            rc_path = self.dir / f"server-{self._count}.rc"
        request = {"argv": list(argv[3:]), "env": dict(env), "log": str(log_path),
                   "cwd": str(cwd) if cwd else None, "rc_path": str(rc_path),
                   "cores": sorted(cores) if cores else None}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(60)
            conn.connect(str(self.socket_path))
            conn.sendall(json.dumps(request).encode() + b"\n")
            answer = read_json_line(conn)
        if "pid" not in answer:
            raise OSError(f"server template refused: {answer.get('error', 'no answer')}")
        return ForkedServer(int(answer["pid"]), rc_path)

    def stop(self) -> None:
        """Stop the template, then remove its folder (a forked server's poll then goes by its
        PID: ForkedServer)."""
        try:
            self.process.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


_TEMPLATES: dict[tuple[str, str, frozenset[int] | None], ServerTemplate] = {}
_TEMPLATES_LOCK = threading.Lock()


def template_for(python: str, log_dir: Path, cores: Iterable[int] | None = None) -> ServerTemplate:
    """This interpreter's template for servers of ``python`` on ``cores`` (one per executable,
    log folder and core set; not started until its first server)."""
    key = (python, str(log_dir), frozenset(cores) if cores else None)
    with _TEMPLATES_LOCK:
        if key not in _TEMPLATES:
            _TEMPLATES[key] = ServerTemplate(python, log_dir, key[2])
        return _TEMPLATES[key]


def stop_templates(log_dir: Path | None = None) -> None:
    """Stop this interpreter's templates (those writing to ``log_dir``, when given)."""
    with _TEMPLATES_LOCK:
        keys = [k for k in _TEMPLATES if log_dir is None or k[1] == str(log_dir)]
        templates = [_TEMPLATES.pop(k) for k in keys]
    for template in templates:
        template.stop()
