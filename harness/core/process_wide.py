"""One object of a kind per harness process, made on first use: the port allocator, the process
ledger and the watchdog are each shared by every thread that starts servers."""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class ProcessWide(Generic[T]):
    """``make()``'s object, made once under a lock (two threads asking first get one object);
    ``replace`` swaps it (tests: a watchdog with a short grace, a ledger in a temp dir)."""

    def __init__(self, make: Callable[[], T], doc: str) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._made: T | None = None
        self.__doc__ = doc

    def __call__(self) -> T:
        with self._lock:
            if self._made is None:
                self._made = self._make()
            return self._made

    def made(self) -> T | None:
        """The object if it was made, without making it."""
        return self._made

    def replace(self, made: T | None) -> T | None:
        """Put ``made`` in its place (None: make afresh on next use); the one it held."""
        with self._lock:
            old, self._made = self._made, made
            return old

    @contextlib.contextmanager
    def replaced(self, made: T) -> Iterator[T]:
        """``made`` in its place for a ``with`` block, the one it held back afterwards."""
        old = self.replace(made)
        try:
            yield made
        finally:
            self.replace(old)


__all__ = ["ProcessWide"]
