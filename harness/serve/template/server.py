"""The server template: one process per run that imports vLLM's API server once; every server of
the run is a fork of it (``python -m harness.serve.template.server SOCKET``).

Why: a vLLM server spends most of its start-up importing. On the 2-core CPU machine a forked,
pinned server took 13-84 s to be ready, of which ``imports`` (launch to the API server's banner)
was 17 s at the median; on the H200, with 8 servers starting together, ``imports`` took 21-23 s
and the API server's configuration up to the engine core 22-25 s (results/reference/
gpu-h200-compile-key-20261202). Every server imports the same modules; here they are imported once and
each server starts from a copy-on-write fork that has them.

What a fork is, and why it runs the same server: the child does what ``python -m
vllm.entrypoints.openai.api_server ARGS`` does after its imports: it runs that module as
``__main__`` with the server's argv, environment, working directory, log file (fds 1 and 2)
and CPU cores. Only modules are shared: the template imports what vLLM itself pre-imports for
its own ``forkserver`` start method (``vllm.v1.engine.async_llm``) and the server module, and
refuses to serve if that import loaded vLLM's general plugins or touched CUDA (the harness's
plugins read each server's own environment when they register, in the child; a CUDA context
cannot cross a fork). It is the state vLLM's API server is in when it forks its engine core.

Protocol (a UNIX socket, one JSON line each way): ``{"argv", "env", "cwd", "log", "cores",
"rc_path"}`` -> ``{"pid"}`` or ``{"error"}``. The child leads a new session (its own process
group: the harness stops it by PGID), gets SIGKILL when the template dies, and the template
writes its exit status to ``rc_path`` when it reaps it. The template gets ``HARNESS_GONE``
(SIGHUP: it has no terminal, nothing else sends it) when the harness dies, SIGTERM when the
harness stops it. On the first it SIGKILLs the group of every server it forked before it exits
(:func:`kill_servers_when_orphaned`): the harness may have died before it registered the
newest one (the watchdog and the ledger know it by then only if a scan saw it), and that
server's engine core, in its group, has no parent-death signal of its own. A signal of its
own, not the parent's PID: a SIGKILLed harness's threads die one by one, and the template is
signalled when its forking thread dies, re-parented to a thread of the same dying harness.

Hand-written because no library forks a pre-imported interpreter into a given argv, environment
and session: ``multiprocessing``'s forkserver hands back Python objects to its own caller, not a
process group the harness can stop by PGID, and it pickles a target instead of running a module.
Single-threaded on purpose (``select`` and ``waitpid(WNOHANG)``): a fork copies one thread only.
"""
from __future__ import annotations

import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import traceback

from harness.serve.supervision.spawn import PDEATHSIG_SUPPORTED, pdeathsig_preexec

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# vLLM's own forkserver mode pre-imports exactly this (api_server.py, VLLM_WORKER_MULTIPROC_METHOD
# =forkserver): the engine client and everything below it, nothing that starts a thread or CUDA
PRELOAD = ("vllm.v1.engine.async_llm", SERVER_MODULE)
READY_LINE = "server-template ready"
HARNESS_GONE = signal.SIGHUP   # the template's parent-death signal (harness.serve.template.client)


def preload() -> None:
    """Import what every server imports; raise when that left state a fork must not inherit."""
    for module in PRELOAD:
        importlib.import_module(module)
    plugins = sys.modules.get("vllm.plugins")
    if plugins is not None and getattr(plugins, "plugins_loaded", False):
        raise RuntimeError("importing vLLM loaded its general plugins: a fork would not register "
                           "the harness's plugins with its own environment")
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        raise RuntimeError("importing vLLM initialised CUDA: a fork cannot use it")
    if threading.active_count() != 1:
        raise RuntimeError(f"importing vLLM started {threading.active_count() - 1} thread(s): a "
                           "fork would copy one thread only")


def run_child(request: dict, listener: socket.socket, template_pid: int) -> int:
    """In the fork: become the server of ``request`` and run it; returns its exit code."""
    listener.close()
    os.setsid()
    if PDEATHSIG_SUPPORTED:
        # SIGKILL when the template dies (OOM, crash): vLLM ignores SIGTERM during start-up
        pdeathsig_preexec(template_pid, signal.SIGKILL)()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    if request.get("cores"):
        os.sched_setaffinity(0, set(request["cores"]))
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(devnull)
    if request.get("cwd"):
        os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [SERVER_MODULE, *request["argv"]]
    try:
        runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - the log says why the server ended
        traceback.print_exc()
        return 1


def _reap(children: dict[int, str]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        rc_path = children.pop(pid, None)
        if rc_path:
            code = os.waitstatus_to_exitcode(status)
            tmp = f"{rc_path}.tmp"
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(str(code))
            os.replace(tmp, rc_path)


def kill_servers_when_orphaned(children: dict[int, str]) -> None:
    """On HARNESS_GONE (the harness died), SIGKILL every forked server's group not yet reaped,
    then die of the signal. SIGTERM (the harness stops the template) leaves the servers to it."""
    template_pid = os.getpid()

    def on_gone(signum: int, frame: object) -> None:
        if os.getpid() == template_pid:   # not a fork before it reset the handler
            for pid in list(children):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(HARNESS_GONE, on_gone)


def read_json_line(conn: socket.socket) -> dict:
    """One JSON line from ``conn`` (both sides of the protocol); {} when it closed first."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return json.loads(data) if data.strip() else {}


def serve(socket_path: str) -> None:
    preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    template_pid = os.getpid()
    children: dict[int, str] = {}
    kill_servers_when_orphaned(children)
    print(f"{READY_LINE} pid={template_pid} socket={socket_path}", flush=True)
    while True:
        readable, _, _ = select.select([listener], [], [], 0.2)
        _reap(children)
        if not readable:
            continue
        conn, _ = listener.accept()
        with conn:
            try:
                request = read_json_line(conn)
            except (OSError, ValueError) as exc:
                conn.sendall(json.dumps({"error": f"bad request: {exc}"}).encode() + b"\n")
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    conn.close()
                    code = run_child(request, listener, template_pid)
                finally:
                    try:
                        sys.stdout.flush()
                        sys.stderr.flush()
                    finally:
                        os._exit(code)
            children[pid] = request.get("rc_path", "")
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")


if __name__ == "__main__":
    serve(sys.argv[1])
