"""Test-only pause points: a window of the process handling that is microseconds wide (a server
forked by the template but not yet registered) held open so a kill test can land in it. Off
unless ``PD_ACCURACY_PAUSE_AT`` names the point; the pause ends at ``PAUSE_S`` or as soon as
``stop()`` says the run was stopped, so a signal finds the window as a real run has it.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

__all__ = ["PAUSE_ENV", "PAUSE_S", "pause_point"]

PAUSE_ENV = "PD_ACCURACY_PAUSE_AT"
PAUSE_S = 120.0


def pause_point(name: str, detail: str, stop: Callable[[], bool] = lambda: False,
                pause_s: float = PAUSE_S) -> bool:
    """Hold this thread at ``name`` when ``PD_ACCURACY_PAUSE_AT`` names it (one line on stderr
    says so, with ``detail``); returns whether it paused."""
    if os.environ.get(PAUSE_ENV) != name:
        return False
    print(f"pd-accuracy pause at {name}: {detail}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + pause_s
    while time.monotonic() < deadline and not stop():
        time.sleep(0.05)
    return True
