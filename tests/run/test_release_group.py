"""run_in ends its child's process group on every exit path, within a bounded time: SIGTERM,
a grace, then SIGKILL; checked on real processes by PID."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.run import releases

# stands in for a release's interpreter: `python -m harness.cli ...` ignores SIGTERM (so does the
# grandchild it starts, the disposition survives exec), writes both PIDs, then sleeps
STUBBORN = f"""#!{sys.executable}
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
grand = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
path = os.environ["PIDS_FILE"]
with open(path + ".tmp", "w") as out:
    out.write(f"{{os.getpid()}} {{grand.pid}}")
os.replace(path + ".tmp", path)
time.sleep(600)
"""


def fake_python(tmp_path: Path, text: str) -> Path:
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(text)
    python.chmod(0o755)
    return python


def gone(pid: int) -> bool:
    """No such process, or a zombie (dead, waiting for its parent: init, for an orphan)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return gone(pid)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("raised", [KeyboardInterrupt, RuntimeError])
def test_an_interrupted_run_kills_a_group_that_ignores_sigterm(tmp_path, monkeypatch, raised):
    python = fake_python(tmp_path, STUBBORN)
    pids_file = tmp_path / "pids"
    monkeypatch.setattr(releases, "TERM_GRACE_S", 0.5)

    def interrupted(self, *args, **kwargs):
        # the parent is interrupted while the child (and its grandchild) run
        deadline = time.monotonic() + 30
        while not pids_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        raise raised("interrupted")

    monkeypatch.setattr(subprocess.Popen, "communicate", interrupted)
    started = time.monotonic()
    with pytest.raises(raised):
        releases.run_in(python, ["run"], env={**os.environ, "PIDS_FILE": str(pids_file)})
    child, grandchild = (int(p) for p in pids_file.read_text().split())
    assert os.getpgid(os.getpid()) != child        # it had a group of its own
    ended = time.monotonic() - started
    assert wait_gone(child) and wait_gone(grandchild), "the group outlived run_in"
    assert ended < 25, f"run_in took {ended:.1f} s to end a 0.5 s grace"


def test_a_child_that_exits_costs_no_grace(tmp_path, monkeypatch):
    python = fake_python(tmp_path, f"#!{sys.executable}\nimport sys\nprint('done')\nsys.exit(3)\n")
    monkeypatch.setattr(releases, "TERM_GRACE_S", 60)
    started = time.monotonic()
    done = releases.run_in(python, ["run"], capture=True)
    assert (done.returncode, done.stdout.strip()) == (3, "done")
    assert time.monotonic() - started < 20
