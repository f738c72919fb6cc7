"""The variable NIXL's idle plugin (in_server/idle.py) reads in each server, and its parse: the
plugin reads it there, the command line checks the same value before a run (SERVER_VARIABLES)."""
from __future__ import annotations

from typing import Mapping

DELAY_ENV = "PD_ACCURACY_NIXL_PTHR_DELAY_US"   # µs NIXL's progress thread sleeps while idle
# 1 ms: the smallest poll() timeout UCX's shared thread can use; idle wake-ups cost ~nothing.
DEFAULT_PTHR_DELAY_US = 1000


def parse_delay_us(env: Mapping[str, str]) -> int:
    """Progress-thread delay in µs from ``env``; 0 means "leave NIXL's default".

    Raises ValueError for a value that is not a non-negative integer.
    """
    raw = env.get(DELAY_ENV, "").strip()
    if not raw:
        return DEFAULT_PTHR_DELAY_US
    delay_us = int(raw)
    if delay_us < 0:
        raise ValueError(f"{DELAY_ENV} must be >= 0, got {raw!r}")
    return delay_us
