"""The baseline's A/A re-run, asked in the background while the P/D pair answers its first look.

The A/A re-run asks the baseline its first look's questions again at concurrency 1: the noise
floor a P/D run is judged against is what two baseline runs with different batch compositions
disagree on. At concurrency 1 it is the longest single request stream of a group, and on CPU
the decode's core idled through it (docs/startup.md). So it is asked in a thread of its own as
soon as the baseline's first answers are in, and a cell's judge waits for it only when a look
needs the floor.

What keeps the noise floor what it was: the re-run must be alone on the baseline server, or its
batches would mix with the baseline's other questions. Every request to the baseline goes
through one `BaselineGate`, so the A/A, the first run and a look's extra baseline questions never
overlap; only the P/D pair, a different server, is asked meanwhile.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, TypeVar

from harness.eval.lmeval import EvalRun

_T = TypeVar("_T")


class BaselineFailed(Exception):
    """The baseline server failed to answer the A/A re-run: environmental, not P/D's fault."""


class BaselineGate:
    """One baseline server's requests, one evaluation at a time (a lock around each call)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, evaluate: Callable[[], _T]) -> _T:
        with self._lock:
            return evaluate()


class AAReruns:
    """The A/A re-runs of one baseline group, asked one after another in a background thread."""

    def __init__(self, gate: BaselineGate) -> None:
        self._gate = gate
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="baseline-aa")

    def submit(self, evaluate: Callable[[], EvalRun]) -> "Future[EvalRun]":
        """Ask the re-run once the baseline server is free; its EvalRun, or BaselineFailed."""
        def job() -> EvalRun:
            try:
                return self._gate(evaluate)
            except Exception as exc:  # noqa: BLE001 - any failure of the baseline is environmental
                raise BaselineFailed(f"baseline A/A re-run failed: {type(exc).__name__}: "
                                     f"{str(exc)[:300]}") from exc
        return self._pool.submit(job)

    def close(self) -> None:
        """Wait for the running re-run (its server is stopped first, so it ends) and drop the rest."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def finished(value: EvalRun | None) -> "Future[EvalRun] | None":
    """An already-known A/A run as a done future (external deployments ask it in line)."""
    if value is None:
        return None
    future: Future[EvalRun] = Future()
    future.set_result(value)
    return future
