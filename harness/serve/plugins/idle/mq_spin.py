"""vLLM general plugin: vLLM's shared-memory message-queue readers sleep instead of spinning.

vLLM 0.32's ``MessageQueue`` (``vllm/distributed/device_communicators/shm_broadcast.py``) carries
every step between the engine core and its worker: the worker reads the scheduler's RPC
broadcast, the engine core reads the worker's response. A reader that finds nothing calls
``sched_yield()`` and checks again, for ``SpinCondition.busy_loop_s`` (1 s) after its last read,
before it blocks on the writer's ZMQ notification. On a GPU host that costs a spare core; on a
CPU host the engine core and its worker are pinned to the same core, so the reader spins on
exactly the core the writer needs: a prefill's engine core, stepping while its requests wait
for the decode to read their KV, used 89 CPU-s against its worker's 32 in one smoke group.

``PD_ACCURACY_MQ_SPIN_SLEEP_US`` (set by ``harness.serve.launch.thread_budget`` for CPU servers)
makes a reader in that busy window sleep that long between checks instead of yielding, so it
leaves the run queue and the writer has the core; a step then waits at most that much longer.
Unset leaves vLLM alone. Not chosen: blocking on the notification at once (``busy_loop_s = 0``)
stretched the baseline's concurrency-1 A/A re-run from ~4 s to 40-64 s a question: the readers
presumably missed notifications (the writer's PUB socket drops beyond one queued message) and
waited for the poll timeout, which the spin otherwise hides.

The patch is a post-import hook on the module, so ``register()`` imports nothing of vLLM itself.
"""
from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any, Mapping

import wrapt

from harness.protocol.switches import MQ_SPIN_SLEEP_ENV as ENV
from harness.protocol.switches import parse_mq_spin_sleep_us
from harness.serve.plugins.entry import vllm_plugin

logger = logging.getLogger("vllm.pd_accuracy.mq_spin")

SHM_BROADCAST = "vllm.distributed.device_communicators.shm_broadcast"



# the variable's parse is the protocol's: the harness checks the same value before a run
parse_sleep_us = parse_mq_spin_sleep_us


def patch_spin_condition(module: Any, sleep_us: int) -> bool:
    """Make every reader ``SpinCondition`` of ``module`` sleep ``sleep_us`` between checks in its
    busy window (also one built before the patch); outside it, vLLM's own blocking wait.

    Returns True when patched (now or before), False when the module does not look like the
    shm_broadcast this was written against (then it is left untouched)."""
    cls = getattr(module, "SpinCondition", None)
    wait = getattr(cls, "wait", None)
    if cls is None or wait is None:
        logger.warning("pd-accuracy mq_spin: %s has no SpinCondition.wait; readers left spinning",
                       getattr(module, "__name__", module))
        return False
    if getattr(wait, "_pd_accuracy_sleep_us", None) is not None:
        return True
    sleep_s = sleep_us / 1e6

    @functools.wraps(wait)
    def sleeping_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        last_read, busy = getattr(self, "last_read", None), getattr(self, "busy_loop_s", None)
        if last_read is not None and busy is not None and time.monotonic() <= last_read + busy:
            time.sleep(sleep_s)
            return None
        return wait(self, *args, **kwargs)

    sleeping_wait._pd_accuracy_sleep_us = sleep_us  # type: ignore[attr-defined]
    cls.wait = sleeping_wait
    return True


@vllm_plugin(logger, "pd-accuracy mq_spin: register() failed; vLLM left as is")
def register() -> None:
    """vLLM ``general_plugins`` entry point (harness.serve.plugins.entry)."""
    sleep_us = parse_sleep_us(os.environ)
    if sleep_us is None:
        return

    def hook(module: Any) -> None:
        from harness.serve.plugins import compat

        if not compat.attach("mq-spin"):
            return
        try:
            if patch_spin_condition(module, sleep_us):
                # WARNING, like kv-digest-setup: INFO of a plugin loaded this early is dropped
                logger.warning("pd-accuracy mq_spin: message-queue readers sleep %d us "
                               "between checks", sleep_us)
        except Exception:
            logger.exception("pd-accuracy mq_spin: patching %s failed", module.__name__)

    wrapt.register_post_import_hook(hook, SHM_BROADCAST)
