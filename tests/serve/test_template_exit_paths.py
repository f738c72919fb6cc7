"""A server template that fails or times out in its own start-up leaves no process and no
folder (kill phase 1 without vLLM: a stand-in interpreter that dies or hangs)."""
from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.serve.supervision.errors import ProcessStartError
from harness.serve.template.client import ServerTemplate


def _stand_in(tmp_path: Path, body: str) -> str:
    """An executable that takes the template's argv and runs `body` (a Python snippet)."""
    script = tmp_path / "python"
    script.write_text(f"#!{sys.executable}\nimport time, sys\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.mark.parametrize("body, reason", [
    ("print('cannot import vllm', flush=True); sys.exit(3)", "exited before it was ready"),
    ("time.sleep(60)", "not ready in 1 s"),
])
def test_a_failing_or_hanging_template_leaves_nothing(tmp_path, body, reason):
    template = ServerTemplate(_stand_in(tmp_path, body), tmp_path / "logs")
    folder = template.dir
    with pytest.raises(ProcessStartError, match=reason):
        template.start(timeout_s=1.0)
    pid = template.process.pid
    assert pid is not None and not psutil.pid_exists(pid) or \
        psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not folder.exists()
    assert not any(p.name().startswith("python") and str(tmp_path) in " ".join(p.cmdline())
                   for p in psutil.process_iter() if p.pid != os.getpid()
                   if _readable(p))


def _readable(p: psutil.Process) -> bool:
    try:
        p.cmdline()
        return True
    except psutil.Error:
        return False


# kill phase 3 without vLLM: a template stand-in with the template's own SIGTERM handling forks a
# "server" (its own session) that starts an "engine" (in its group); the harness stand-in dies
TEMPLATE = """
import os, subprocess, sys, time
from harness.serve.template.server import kill_servers_when_orphaned
children = {}
kill_servers_when_orphaned(children)
pid = os.fork()
if pid == 0:
    os.setsid()
    engine = subprocess.Popen(["sleep", "60"])
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {engine.pid}")
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(60)
    os._exit(0)
children[pid] = ""
time.sleep(60)
"""
HARNESS = """
import os, subprocess, sys, time
from harness.serve.supervision.spawn import pdeathsig_preexec
from harness.serve.template.server import HARNESS_GONE
t = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                     preexec_fn=pdeathsig_preexec(os.getpid(), HARNESS_GONE),
                     start_new_session=True)
print(t.pid, flush=True)
time.sleep(60)
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("who", ["harness-killed", "template-stopped"])
def test_an_orphaned_template_kills_its_servers_groups(tmp_path, who):
    import signal
    import subprocess

    out = tmp_path / "pids"
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, TEMPLATE, str(out)],
                               stdout=subprocess.PIPE, text=True, start_new_session=True,
                               env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    server = engine = None
    try:
        template = int(harness.stdout.readline())
        for _ in range(200):
            if out.exists():
                break
            time.sleep(0.05)
        server, engine = map(int, out.read_text().split())
        if who == "harness-killed":   # the template gets its parent-death signal
            harness.kill()
        else:                          # a live harness stops its template: the servers are its own
            os.kill(template, signal.SIGTERM)
        for _ in range(100):
            if _gone(template) and (_gone(server) and _gone(engine) or who != "harness-killed"):
                break
            time.sleep(0.05)
        assert _gone(template)
        if who == "harness-killed":
            assert _gone(server) and _gone(engine), "the server's group outlived its template"
        else:
            assert not _gone(server) and not _gone(engine)
    finally:
        harness.kill()
        harness.wait()
        if server is not None:
            try:
                os.killpg(server, signal.SIGKILL)
            except ProcessLookupError:
                pass
