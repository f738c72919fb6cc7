"""A server template that fails or times out in its own start-up leaves no process and no
folder (issue #33, kill phase 1 without vLLM: a stand-in interpreter that dies or hangs)."""
from __future__ import annotations

import os
import stat
import sys
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
