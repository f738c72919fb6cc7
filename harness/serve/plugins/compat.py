"""The gate every harness hook into vLLM passes before it patches anything.

What each hook needs is one table, :mod:`harness.core.vllm_hooks`; :func:`attach` asks it in
the vLLM process at the moment the hook would patch (its module already imported). On a vLLM
that lacks a need the hook does not attach, the engine stays as vLLM built it, and the server
log says ``pd-accuracy compat: <hook> not available on vLLM <version>: <missing>``.
"""
from __future__ import annotations

import importlib
import logging
import threading
from typing import Callable

from harness.core.vllm_hooks import hook, missing, unavailable_line, vllm_version

logger = logging.getLogger("vllm.pd_accuracy.compat")

LOG_PREFIX = "pd-accuracy compat:"

_decided: dict[str, bool] = {}
_decide_lock = threading.Lock()


def attach(name: str, importer: Callable[[str], object] = importlib.import_module,
           log: logging.Logger | None = None) -> bool:
    """Whether hook ``name`` may attach in this process (decided once); when not, one line in
    the server log names what this vLLM lacks and the hook leaves vLLM untouched."""
    with _decide_lock:
        if name in _decided:
            return _decided[name]
        try:
            why = missing(name, importer)
        except Exception as error:  # noqa: BLE001 - a gate that fails keeps vLLM untouched
            why = f"the compatibility check failed ({type(error).__name__}: {error})"
        _decided[name] = why is None
    if why is not None:
        (log or logger).warning("%s %s; off: %s", LOG_PREFIX,
                                unavailable_line(name, why, vllm_version()),
                                ", ".join(hook(name).serves))
    return why is None


def forget() -> None:
    """Decide every hook afresh (tests)."""
    with _decide_lock:
        _decided.clear()


__all__ = ["LOG_PREFIX", "attach", "forget"]
