"""The expiry weather's fault in the decode (``late-read``): a tagged request's KV read starts
late.

The weather needs a decode whose read comes after the prefill's KV lease
(``kv_lease_duration``) ran out, the way a slow or stalled decode does: vLLM 0.32's prefill then
releases the request's blocks (its connector counts them expired) and a read that still comes
finds blocks that may hold another prompt's KV. The decode must answer such a request with an
error or a right answer, never a wrong HTTP 200.

How: on the decode's scheduler side of the connector interface, a request whose id carries
:func:`harness.weathers.expiry.protocol.request_tag` is held back from the connector
(``get_num_new_matched_tokens`` answers ``None``: "cannot tell yet", and vLLM's scheduler skips
the request that step) until its delay has passed since it arrived (``on_new_request``); and
the decode sends no lease-renewal heartbeats for it (the connector module's
``stop_lease_renewal``, in its package's ``in_server``), so nothing extends the prefill's
lease. Then the read runs as usual. Each held request gives one :data:`HELD_PREFIX` line when
held and one when released (the lines and their parser: this package's ``protocol``). Armed by
:mod:`harness.serve.plugins.faults.decode` under ``PD_ACCURACY_FAULT=by-request``.
"""
from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable

from harness.weathers.expiry.protocol import HELD_PREFIX, held_line, parse_delay_ms, released_line

logger = logging.getLogger("vllm.pd_accuracy.late_read")

_MARK = "__pd_accuracy_late_read__"


class Hold:
    """Which requests are held and until when (one per connector class; the scheduler process
    runs one connector)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.until: dict[str, tuple[float, float, int]] = {}   # id -> (arrived, until, delay)

    def arrive(self, request_id: str) -> int | None:
        """Start holding ``request_id`` if its id asks for it; its delay in ms, or None."""
        delay_ms = parse_delay_ms(request_id)
        if delay_ms is not None:
            now = self.clock()
            self.until[request_id] = (now, now + delay_ms / 1000.0, delay_ms)
        return delay_ms

    def waiting(self, request_id: str) -> bool:
        """Whether ``request_id`` is still held; a released one is forgotten (and logged)."""
        held = self.until.get(request_id)
        if held is None:
            return False
        arrived, until, delay_ms = held
        now = self.clock()
        if now < until:
            return True
        del self.until[request_id]
        logger.warning("%s", released_line(request_id, delay_ms, int((now - arrived) * 1000)))
        return False


def stop_heartbeat(connector: Any, request_id: str) -> str:
    """Stop the decode's lease-renewal heartbeats for ``request_id`` where its connector's
    module knows how; what happened, for the log line."""
    from harness.serve.plugins.kv_events import interface

    module = interface.specifics_for(type(connector))
    stop = getattr(module, "stop_lease_renewal", None) if module is not None else None
    if stop is None:
        return "none"      # a connector without renewals: nothing extends the lease anyway
    return "stopped" if stop(connector, request_id) else "none"


def patch_class(cls: type, hold: Hold) -> None:
    """Wrap ``cls``'s ``on_new_request`` and ``get_num_new_matched_tokens``; idempotent."""
    arrive_original = getattr(cls, "on_new_request", None)
    match_original = getattr(cls, "get_num_new_matched_tokens", None)
    if match_original is None or getattr(match_original, _MARK, False):
        return
    from harness.serve.plugins import compat

    if not compat.attach("late-read"):
        return

    @functools.wraps(match_original)
    def get_num_new_matched_tokens(self, request, *args, **kwargs):
        try:
            if hold.waiting(request.request_id):
                return None, False      # vLLM's "cannot tell yet": skipped this step
        except Exception:  # noqa: BLE001 - a weather fault never takes the server down
            logger.exception("%s hold check failed", HELD_PREFIX)
        return match_original(self, request, *args, **kwargs)

    setattr(get_num_new_matched_tokens, _MARK, True)
    cls.get_num_new_matched_tokens = get_num_new_matched_tokens
    if arrive_original is None:
        return

    @functools.wraps(arrive_original)
    def on_new_request(self, request, *args, **kwargs):
        result = arrive_original(self, request, *args, **kwargs)
        try:
            delay_ms = hold.arrive(request.request_id)
            if delay_ms is not None:
                heartbeat = stop_heartbeat(self, request.request_id)
                logger.warning("%s", held_line(request.request_id, delay_ms, heartbeat))
        except Exception:  # noqa: BLE001
            logger.exception("%s arrival hook failed", HELD_PREFIX)
        return result

    cls.on_new_request = on_new_request


def arm() -> None:
    """Hold tagged requests on every connector class vLLM's factory hands out."""
    from harness.serve.plugins.kv_events import interface

    hold = Hold()
    interface.patch_classes_with(functools.partial(_patch, hold=hold))
    interface.install()


def _patch(cls: type, hold: Hold) -> None:
    patch_class(cls, hold)
