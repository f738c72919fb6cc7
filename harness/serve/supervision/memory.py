"""Memory of one process: its RSS now and its high-water mark (for ManagedProcess's tree sums)."""
from __future__ import annotations

import psutil

from harness.serve.host.liveness import is_zombie

__all__ = ["peak_rss_of", "rss_of"]


def rss_of(proc: psutil.Process) -> int:
    try:
        return 0 if is_zombie(proc) else proc.memory_info().rss
    except psutil.Error:
        return 0


def peak_rss_of(proc: psutil.Process) -> int:
    # VmHWM is the kernel's own high-water mark of this process's RSS; no sampling needed.
    try:
        with open(f"/proc/{proc.pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return rss_of(proc)
