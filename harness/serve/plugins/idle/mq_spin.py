"""vLLM general plugin: bound how long vLLM's shared-memory message-queue readers spin.

vLLM 0.32's ``MessageQueue`` (``vllm/distributed/device_communicators/shm_broadcast.py``) carries
every step between the engine core and its worker: the worker reads the scheduler's RPC
broadcast, the engine core reads the worker's response. A reader that finds nothing keeps
calling ``sched_yield()`` for ``SpinCondition.busy_loop_s`` (hard-coded 1 s) after its last read
before it blocks on the writer's ZMQ notification. On a GPU host that spin costs a spare core;
on a CPU host the engine core and its worker are pinned to the same core, so the reader spins
on exactly the core the writer needs. Every write notifies (``enqueue`` ends in ``notify()``),
so a reader that blocks at once still wakes for each message.

``PD_ACCURACY_MQ_BUSY_LOOP_S`` (seconds, set by ``harness.serve.launch.thread_budget`` for CPU
servers) lowers every reader's ``busy_loop_s`` to at most that; unset leaves vLLM alone. The
patch is a post-import hook on the module, so ``register()`` imports nothing of vLLM itself.
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, Mapping

import wrapt

logger = logging.getLogger("vllm.pd_accuracy.mq_spin")

ENV = "PD_ACCURACY_MQ_BUSY_LOOP_S"
SHM_BROADCAST = "vllm.distributed.device_communicators.shm_broadcast"

_registered = False


def parse_busy_loop_s(env: Mapping[str, str]) -> float | None:
    """The spin bound in seconds, None when unset; ValueError when not a number >= 0."""
    raw = env.get(ENV, "").strip()
    if not raw:
        return None
    value = float(raw)
    if value < 0:
        raise ValueError(f"{ENV} must be >= 0, got {raw!r}")
    return value


def patch_spin_condition(module: Any, busy_loop_s: float) -> bool:
    """Make every reader ``SpinCondition`` of ``module`` spin at most ``busy_loop_s``, also one
    built before the patch (``wait`` lowers the bound on each call).

    Returns True when patched (now or before), False when the module does not look like the
    shm_broadcast this was written against (then it is left untouched)."""
    cls = getattr(module, "SpinCondition", None)
    wait = getattr(cls, "wait", None)
    if cls is None or wait is None:
        logger.warning("pd-accuracy mq_spin: %s has no SpinCondition.wait; readers left spinning",
                       getattr(module, "__name__", module))
        return False
    if getattr(wait, "_pd_accuracy_busy_loop_s", None) is not None:
        return True

    @functools.wraps(wait)
    def bounded_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "busy_loop_s", 0) > busy_loop_s:
            self.busy_loop_s = busy_loop_s
        return wait(self, *args, **kwargs)

    bounded_wait._pd_accuracy_busy_loop_s = busy_loop_s  # type: ignore[attr-defined]
    cls.wait = bounded_wait
    return True


def register() -> None:
    """vLLM ``general_plugins`` entry point. Cheap, idempotent, never raises."""
    global _registered
    if _registered:
        return
    _registered = True
    try:
        busy_loop_s = parse_busy_loop_s(os.environ)
        if busy_loop_s is None:
            return

        def hook(module: Any) -> None:
            try:
                if patch_spin_condition(module, busy_loop_s):
                    logger.info("pd-accuracy mq_spin: message-queue readers spin at most %g s",
                                busy_loop_s)
            except Exception:
                logger.exception("pd-accuracy mq_spin: patching %s failed", module.__name__)

        wrapt.register_post_import_hook(hook, SHM_BROADCAST)
    except Exception:
        logger.exception("pd-accuracy mq_spin: register() failed; vLLM left as is")
