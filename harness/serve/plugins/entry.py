"""What every vLLM general plugin of the harness hands vLLM as ``register``.

vLLM calls each plugin's ``register()`` in every process it starts (API server, engine core,
workers), and may call it more than once. So a plugin must set itself up once per process, do
nothing in a server that did not ask for it (its environment variable unset), and never raise:
a plugin that fails leaves vLLM as it is and says why in the server's log. `vllm_plugin` is that
contract, written once; a plugin module writes only its setup.
"""
from __future__ import annotations

import functools
import logging
from typing import Callable


class PluginEntry:
    """A plugin's ``register``: `setup()` once, when `wanted()`; an exception is logged."""

    def __init__(self, setup: Callable[[], None], logger: logging.Logger, failed: str,
                 wanted: Callable[[], bool]) -> None:
        self.setup, self.logger, self.failed, self.wanted = setup, logger, failed, wanted
        self.done = False       # a test sets it back to call register() afresh
        functools.update_wrapper(self, setup)

    def __call__(self) -> None:
        if self.done or not self.wanted():
            return
        self.done = True
        try:
            self.setup()
        except Exception:  # noqa: BLE001 - never stop vLLM from starting
            self.logger.exception(self.failed)


def vllm_plugin(logger: logging.Logger, failed: str,
                wanted: Callable[[], bool] = lambda: True) -> Callable[[Callable[[], None]],
                                                                    PluginEntry]:
    """Decorates a plugin's setup into its ``register``; `failed` is the line logged (with the
    traceback) when the setup raises, saying what vLLM runs without."""
    return lambda setup: PluginEntry(setup, logger, failed, wanted)


__all__ = ["PluginEntry", "vllm_plugin"]
