"""The ``early-release`` canary: the prefill frees a request's blocks too early.

vLLM's prefill keeps a finished request's blocks until the decode says it has read them, or
until their lease expires (``kv_lease_duration``, 30 s; the decode's heartbeats extend it while
the request waits in its queue). This fault keeps the lease, as vLLM does, but cuts it to a
fraction of a second (``PD_ACCURACY_FAULT_HOLD_S``, default 0.5) from the moment the prefill
worker first holds the request, and the decode cannot extend it. The release then runs through
vLLM's own path for a lease that ran out (the blocks go back to the prefill's pool, a late "done reading" is
ignored), so nothing crashes: a decode that reads at once reads the right bytes, a late one
reads whatever the recycled blocks hold by then. Calm weather cannot see it; load must.

Where it hooks: the connector's send leases, before each step's lease check
(:func:`harness.serve.plugins.kv_events.interface.hold_leases`; the connector package's
``in_server`` gives that moment), on the prefill
(``PD_ACCURACY_PREFILL_FAULT=by-request``), for the requests whose id carries the
``early-release`` tag. One fault line per request it shortened (spec.format_fault_line).
"""
from __future__ import annotations

import logging
import os
from typing import Any

from harness.serve.plugins.kv_events import interface
from harness.protocol.faults import (ARMED_PREFIX, BY_REQUEST, EARLY_RELEASE,
                                     PREFILL_FAULT_ENV, FaultOutcome, FaultSpec,
                                     format_fault_line, hold_seconds,
                                     parse_request_fault)

logger = logging.getLogger("vllm.pd_accuracy.early_release")

_FIRST_HELD = "_pd_accuracy_first_held"


def wants_early_release(request_id: str) -> bool:
    tagged = parse_request_fault(request_id)
    return tagged is not None and tagged.kind == EARLY_RELEASE


def clamp_leases(worker: Any, leases: dict, hold_s: float, now: float) -> list[str]:
    """Cut each tagged request's lease in ``leases`` (request id -> deadline) to ``hold_s``
    after ``worker`` first held it (re-applied every step: a heartbeat's extension is undone).
    Returns the requests held for the first time."""
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


def make_cut(hold_s: float):
    def cut(worker: Any, leases: dict, now: float) -> None:
        for request_id in clamp_leases(worker, leases, hold_s, now):
            logger.warning("%s", format_fault_line(request_id, FaultSpec(EARLY_RELEASE),
                                                   FaultOutcome(applied=True)))
    return cut


def arm(env: dict[str, str] | None = None) -> bool:
    """Arm on a prefill whose PD_ACCURACY_PREFILL_FAULT is by-request; True when armed. Never
    raises."""
    env = dict(os.environ if env is None else env)
    if env.get(PREFILL_FAULT_ENV, "").strip() != BY_REQUEST:
        return False
    try:
        hold_s = hold_seconds(env)
        armed = interface.hold_leases(make_cut(hold_s))
    except Exception:
        logger.exception("%s could not arm %s", ARMED_PREFIX, EARLY_RELEASE)
        return False
    if armed:
        logger.warning("%s fault=%s hold=%gs pid=%d", ARMED_PREFIX, EARLY_RELEASE, hold_s,
                       os.getpid())
    else:
        logger.error("%s no connector module gives a lease hook; %s NOT armed", ARMED_PREFIX,
                     EARLY_RELEASE)
    return armed
