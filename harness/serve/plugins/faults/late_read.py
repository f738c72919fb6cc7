"""The ``late-read`` weather fault: the decode server starts a tagged request's KV read late.

The ``expiry`` weather needs a decode whose read comes after the prefill's KV lease
(``kv_lease_duration``) ran out, the way a slow or stalled decode does: vLLM 0.32's prefill then
releases the request's blocks (its connector counts them expired) and a read that still comes
finds blocks that may hold another prompt's KV. The decode must answer such a request with an
error or a right answer, never a wrong HTTP 200.

How: on the decode's scheduler side of the connector interface, a request whose id carries
:func:`request_tag` is held back from the connector (``get_num_new_matched_tokens`` answers
``None``: "cannot tell yet", and vLLM's scheduler skips the request that step) until its delay
has passed since it arrived (``on_new_request``); and the decode sends no lease-renewal
heartbeats for it (the connector module's ``stop_lease_renewal``, under
``kv_events/by_connector/``), so nothing extends the prefill's lease. Then
the read runs as usual. Each held request gives one :data:`HELD_PREFIX` line when held and one
when released, which :func:`parse_late_read_log` reads back. Armed by
:mod:`harness.serve.plugins.faults.decode` under ``PD_ACCURACY_FAULT=by-request``.
"""
from __future__ import annotations

import functools
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

logger = logging.getLogger("vllm.pd_accuracy.late_read")

KIND = "late-read"
HELD_PREFIX = "pd-accuracy late-read:"
_TAG_RE = re.compile(r"wx\.late-read\.(?P<delay_ms>\d+)\.")
_LINE_RE = re.compile(
    r"pd-accuracy late-read: (?P<event>held|released) request=(?P<request>\S+) "
    r"delay_ms=(?P<delay_ms>\d+)(?: waited_ms=(?P<waited_ms>\d+))?(?: heartbeat=(?P<hb>\S+))?")
_MARK = "__pd_accuracy_late_read__"


def request_tag(delay_ms: int) -> str:
    """What a late-read request's id carries after ``pdacc-`` (the proxy's request tag)."""
    if delay_ms <= 0:
        raise ValueError(f"late-read delay {delay_ms} ms: expected a positive delay")
    return f"wx.{KIND}.{int(delay_ms)}."


def parse_delay_ms(request_id: str) -> int | None:
    """The read delay a request id asks for, or None for a request to read at once."""
    match = _TAG_RE.search(request_id)
    return int(match["delay_ms"]) if match else None


@dataclass(frozen=True)
class LateReadLine:
    """One parsed late-read line of a decode server log."""

    event: str          # "held" | "released"
    request_id: str
    delay_ms: int
    waited_ms: int | None
    heartbeat: str | None


def parse_late_read_log(log_text: str) -> list[LateReadLine]:
    """Every late-read line of ``log_text`` (a decode server log), in order."""
    found = []
    for line in log_text.splitlines():
        match = _LINE_RE.search(line) if HELD_PREFIX in line else None
        if match:
            found.append(LateReadLine(
                match["event"], match["request"], int(match["delay_ms"]),
                int(match["waited_ms"]) if match["waited_ms"] else None, match["hb"]))
    return found


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
        logger.warning("%s released request=%s delay_ms=%d waited_ms=%d", HELD_PREFIX,
                       request_id, delay_ms, int((now - arrived) * 1000))
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
                logger.warning("%s held request=%s delay_ms=%d heartbeat=%s", HELD_PREFIX,
                               request.request_id, delay_ms, heartbeat)
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
