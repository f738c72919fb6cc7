"""The ``fail-transfer`` canary: the decode server's connector reports an intact read as failed.

vLLM must never serve a failed KV read as a success (the upstream bug class: HTTP 200 with
garbage, or the previous prompt's answer). This canary makes a tagged request's read fail the
way a real one does, so that everything after it is vLLM's own failure handling, and the
harness must see the failure (:mod:`harness.protocol.faults` names the fault, its tag
and its log lines; :mod:`harness.serve.plugins.faults.decode` arms this module).

Where it hooks: the connector interface's ``arrived`` event
(:mod:`harness.serve.plugins.kv_events.interface`): the connector's read poll reports a
request's reads done, before its post-processing. Failing it there is the connector's own
failure path (``fail()``, from its package's ``in_server``): its
failed-transfer stat, the request in ``failed_recving``, its blocks queued as invalid, its
post-processing skipped; the scheduler then fails the request (``kv_load_failure_policy``
"fail", the default: finish reason ``error``, which the OpenAI server answers with HTTP 500) or
recomputes its prompt ("recompute"). vLLM's connector interface has no such moment of its own:
a connector whose module does not give it cannot run this canary, and its server log says so
(:func:`on_registered`). Requests that failed already and untagged ones are left alone.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable

from harness.serve.plugins.kv_events import interface
from harness.serve.plugins.kv_events.interface import KVView, Received
from harness.protocol.faults import (
    ARMED_PREFIX,
    BY_REQUEST,
    FAIL_TRANSFER,
    SKIPPED_PREFIX,
    FaultOutcome,
    FaultSpec,
    format_fault_line,
    parse_request_fault,
)

logger = logging.getLogger("vllm.pd_accuracy.fail_transfer")

FAIL_ORDER = 10


def wants_failure(request_id: str, spec: FaultSpec) -> bool:
    """Whether ``spec`` fails this request's read: every request under PD_ACCURACY_FAULT=
    fail-transfer, only the ones tagged with it under by-request."""
    if spec.kind == FAIL_TRANSFER:
        return True
    if spec.kind != BY_REQUEST:
        return False
    tagged = parse_request_fault(request_id)
    return tagged is not None and tagged.kind == FAIL_TRANSFER


def make_on_arrived(spec: FaultSpec) -> Callable[[Any, Any, Received, Callable[[], None]], None]:
    """Event ``arrived``: report the read of a request ``spec`` wants failed as failed, one
    fault line each (the blocks vLLM is told did not load); never raises."""
    line_spec = FaultSpec(FAIL_TRANSFER)

    def on_arrived(connector: Any, view: KVView | None, request: Received,
                   fail: Callable[[], None]) -> None:
        if not wants_failure(request.request_id, spec):
            return
        try:
            fail()
            outcome = FaultOutcome(applied=True, block_ids=request.block_ids)
        except Exception as error:  # a canary must never take the server down
            logger.exception("%s request %s", SKIPPED_PREFIX, request.request_id)
            outcome = FaultOutcome(applied=False, reason=type(error).__name__)
        logger.warning("%s", format_fault_line(request.request_id, line_spec, outcome))

    return on_arrived


def on_registered(connector: Any, view: KVView | None) -> None:
    """Event ``registered``: say in the server log whether this connector can fail a read."""
    if interface.gives_arrival(connector):
        logger.warning("%s fault=%s connector=%s pid=%d", ARMED_PREFIX, FAIL_TRANSFER,
                       type(connector).__name__, os.getpid())
    else:
        logger.error("%s connector %s has no read moment before post-processing; %s NOT "
                     "armed", ARMED_PREFIX, type(connector).__name__, FAIL_TRANSFER)


def arm(spec: FaultSpec) -> bool:
    """Subscribe to the connector interface for PD_ACCURACY_FAULT=fail-transfer or by-request;
    True when armed. Never raises."""
    if spec.kind not in (FAIL_TRANSFER, BY_REQUEST):
        return False
    try:
        interface.subscribe("registered", on_registered, FAIL_ORDER)
        interface.subscribe("arrived", make_on_arrived(spec), FAIL_ORDER)
        interface.install()
    except Exception:
        logger.exception("%s could not arm fail-transfer", ARMED_PREFIX)
        return False
    return True
