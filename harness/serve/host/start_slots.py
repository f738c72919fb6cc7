"""A host-wide cap on how many vLLM servers are in start-up at once.

Start-up is CPU-bound (imports, torch.compile, CUDA-graph capture). On the 32-core 2xH200 about 30
tiny-model servers starting together took 220-500 s each, and with a few more every TP2 server hit
the 420 s start-up limit while still compiling (results/reference/gpu-h200x2-pr-hetero-tp-20261130). With a
cap, the servers beyond it wait for a slot instead, and each one's start-up deadline counts from
the moment it got one.

A slot is one of ``limit`` lock files in the shared lock directory (``filelock``, as the port and
GPU registries), so pytest-xdist workers, farm steps and concurrent ``pd-accuracy run``s of one
host share the cap without knowing of each other. A crashed holder's lock goes with its process.
``limit`` 0 or None means no cap: nothing waits (the default; CPU CI runs 3 servers on 2 cores).
"""
from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import filelock

ENV_VAR = "PD_ACCURACY_MAX_STARTING"


class StartSlotTimeout(TimeoutError):
    pass


class StartSlot:
    """One held slot; release() is idempotent."""

    def __init__(self, lock: filelock.BaseFileLock, index: int) -> None:
        self._lock = lock
        self.index = index

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release(force=True)


class StartSlots:
    def __init__(self, limit: int, lock_dir: str | os.PathLike[str] | None = None,
                 poll_s: float = 0.2) -> None:
        if limit < 1:
            raise ValueError(f"start slots: limit must be >= 1, got {limit}")
        from harness.serve.host.ports import default_lock_dir

        self.limit = limit
        self.dir = Path(lock_dir) if lock_dir is not None else default_lock_dir() / "start-slots"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.poll_s = poll_s

    @classmethod
    def from_limit(cls, limit: int | None, lock_dir: str | os.PathLike[str] | None = None
                   ) -> "StartSlots | None":
        """None (no cap) for limit None or 0."""
        return cls(limit, lock_dir) if limit else None

    @staticmethod
    def limit_from_env(environ: dict[str, str] | None = None) -> int | None:
        raw = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
        if not raw:
            return None
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{ENV_VAR}={raw!r}: expected a whole number of servers") from None
        if value < 0:
            raise ValueError(f"{ENV_VAR}={raw!r}: expected 0 (no cap) or more")
        return value or None

    def acquire(self, timeout_s: float | None = None,
                cancelled: threading.Event | None = None) -> StartSlot | None:
        """Block until a slot is free and return it; None if ``cancelled`` was set meanwhile.
        Raises StartSlotTimeout after ``timeout_s`` (None: wait as long as it takes)."""
        started = time.monotonic()
        while True:
            # every free slot is as good as another: start at a random one so waiters spread out
            first = random.randrange(self.limit)
            for k in range(self.limit):
                index = (first + k) % self.limit
                # a fresh lock object per attempt: flock locks belong to the open file, so two
                # threads of one process exclude each other like two processes do
                lock = filelock.FileLock(str(self.dir / f"slot-{index}.lock"), thread_local=False)
                try:
                    lock.acquire(timeout=0)
                except filelock.Timeout:
                    continue
                return StartSlot(lock, index)
            if cancelled is not None and cancelled.is_set():
                return None
            if timeout_s is not None and time.monotonic() - started >= timeout_s:
                raise StartSlotTimeout(
                    f"no start-up slot free after {timeout_s:g}s ({self.limit} servers may start "
                    f"at once on this host; {ENV_VAR})")
            if cancelled is not None:
                cancelled.wait(self.poll_s)
            else:
                time.sleep(self.poll_s)
