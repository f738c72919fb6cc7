"""The ``early-release`` canary: the prefill frees a request's blocks too early.

vLLM's prefill keeps a finished request's blocks until the decode says it has read them, or
until their lease expires (``kv_lease_duration``, 30 s; the decode's heartbeats extend it while
the request waits in its queue). This fault keeps the lease, as vLLM does, but cuts it to a
fraction of a second (``PD_ACCURACY_FAULT_HOLD_S``, default 0.5) from the moment the prefill
worker first holds the request, and the decode cannot extend it. The release then runs through
vLLM's own expiry path (the blocks go back to the prefill's pool, a late "done reading" is
ignored), so nothing crashes: a decode that reads at once reads the right bytes, a late one
reads whatever the recycled blocks hold by then. Calm weather cannot see it; load must.

Where it hooks: NIXL's send-lease reaper ``NixlBaseConnectorWorker._reap_expired_send_leases``
(the worker's per-step check of ``_reqs_to_send``: request id -> lease deadline), on the prefill
(``PD_ACCURACY_PREFILL_FAULT=by-request``), for the requests whose id carries the
``early-release`` tag. One fault line per request it shortened (spec.format_fault_line).
"""
from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any

from harness.serve.plugins.faults.spec import (ARMED_PREFIX, BY_REQUEST, EARLY_RELEASE,
                                               PREFILL_FAULT_ENV, FaultOutcome, FaultSpec,
                                               format_fault_line, hold_seconds,
                                               parse_request_fault)

logger = logging.getLogger("vllm.pd_accuracy.early_release")

WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"
WORKER_CLASS = "NixlBaseConnectorWorker"
REAPER = "_reap_expired_send_leases"
_MARK = "__pd_accuracy_early_release__"
_FIRST_HELD = "_pd_accuracy_first_held"


def wants_early_release(request_id: str) -> bool:
    tagged = parse_request_fault(request_id)
    return tagged is not None and tagged.kind == EARLY_RELEASE


def clamp_leases(worker: Any, hold_s: float, now: float) -> list[str]:
    """Cut each tagged request's lease in ``worker._reqs_to_send`` to ``hold_s`` after the
    worker first held it (re-applied every step: a heartbeat's extension is undone). Returns
    the requests held for the first time."""
    leases = getattr(worker, "_reqs_to_send", None)
    if not leases:
        return []
    first_held: dict[str, float] = worker.__dict__.setdefault(_FIRST_HELD, {})
    new = []
    for request_id, deadline in list(leases.items()):
        if not wants_early_release(request_id):
            continue
        if request_id not in first_held:
            first_held[request_id] = now
            new.append(request_id)
        leases[request_id] = min(deadline, first_held[request_id] + hold_s)
    for request_id in [r for r in first_held if r not in leases]:
        del first_held[request_id]      # released: forget it
    return new


def patch_worker(cls: Any, hold_s: float) -> bool:
    """Wrap ``cls``'s lease reaper; idempotent. False when vLLM has no such method."""
    original = getattr(cls, REAPER, None)
    if original is None:
        logger.error("%s %s has no %s; %s NOT armed", ARMED_PREFIX, cls.__name__, REAPER,
                     EARLY_RELEASE)
        return False
    if getattr(original, _MARK, False):
        return True

    @functools.wraps(original)
    def reap(self: Any, done_sending: set[str]) -> None:
        try:
            for request_id in clamp_leases(self, hold_s, time.perf_counter()):
                logger.warning("%s", format_fault_line(
                    request_id, FaultSpec(EARLY_RELEASE),
                    FaultOutcome(applied=True, reason=f"hold={hold_s:g}s")))
        except Exception:  # a canary must never take the server down
            logger.exception("pd-accuracy early-release: clamp failed")
        return original(self, done_sending)

    setattr(reap, _MARK, True)
    setattr(cls, REAPER, reap)
    logger.warning("%s fault=%s hold=%gs pid=%d", ARMED_PREFIX, EARLY_RELEASE, hold_s, os.getpid())
    return True


def arm(env: dict[str, str] | None = None) -> bool:
    """Arm on a prefill whose PD_ACCURACY_PREFILL_FAULT is by-request (a post-import hook on
    NIXL's worker module); True when armed. Never raises."""
    env = dict(os.environ if env is None else env)
    if env.get(PREFILL_FAULT_ENV, "").strip() != BY_REQUEST:
        return False
    try:
        hold_s = hold_seconds(env)
        import wrapt

        wrapt.register_post_import_hook(
            lambda module: patch_worker(getattr(module, WORKER_CLASS), hold_s), WORKER_MODULE)
    except Exception:
        logger.exception("%s could not arm %s", ARMED_PREFIX, EARLY_RELEASE)
        return False
    return True
