"""The words of the aborts weather: the tag that asks the proxy to cancel a request at one phase
of its two hops, and what the client then gets (its ``proxy`` cancels, its ``driver`` reads the
records back; standard library only, as harness.protocol).

A client that goes away is an abort to vLLM (the connection closes, the server aborts the
request), and P/D has four moments where that strands or races KV (vllm #41269, #46240,
#46283, #50754): the proxy cancels a request whose id carries :func:`request_tag` at

* ``queued``: the prefill hop is dropped before the prefill answered (queued or computing);
* ``prefilled``: the prefill answered, the decode hop is never sent (the prefill holds the
  blocks for a decode that never comes, until its lease runs out);
* ``reading``: the decode hop is dropped :data:`READING_CANCEL_S` after it was sent, before
  its first token (the decode is allocating or reading the KV);
* ``decoding``: the decode hop is streamed upstream and dropped after its first token.

``mix`` deals the tagged requests to the four in turn (each phase hit once in every four
cancelled requests, however few were tagged). The client gets
:data:`ABORT_STATUS` with the phase named: loud, and counted against the injected aborts. What
must hold afterwards (survivors right, both servers' KV usage back to idle, a clean tail right)
is judged from the records and ``/metrics``, not here.
"""
from __future__ import annotations

import re

PHASES = ("queued", "prefilled", "reading", "decoding")
MIX = "mix"
ABORT_STATUS = 499            # nginx's "client closed request": no vLLM answer means this
QUEUED_CANCEL_S = 0.001       # before any CPU prefill of a 600-token prompt can answer
READING_CANCEL_S = 0.02       # after the decode got the request, before its first token
_TAG_RE = re.compile(r"wx\.abort\.(?P<phase>[a-z]+)\.")


def request_tag(phase: str) -> str:
    """What an aborted request's id carries after ``pdacc-`` (the proxy's request tag)."""
    if phase not in PHASES + (MIX,):
        raise ValueError(f"abort phase {phase!r}: expected one of {PHASES + (MIX,)}")
    return f"wx.abort.{phase}."


def abort_phase(request_id: str, turn: int = 0) -> str | None:
    """The phase at which the proxy cancels this request, or None to leave it alone; ``mix``
    deals :data:`PHASES` in turn (``turn``: how many tagged requests came before)."""
    match = _TAG_RE.search(request_id or "")
    if match is None:
        return None
    phase = match["phase"]
    if phase == MIX:
        return PHASES[turn % len(PHASES)]
    return phase if phase in PHASES else None


def abort_message(phase: str) -> str:
    """The error the client gets for a request the weather cancelled."""
    return f"aborted by the pd-accuracy aborts weather at phase {phase}"


__all__ = ["ABORT_STATUS", "MIX", "PHASES", "QUEUED_CANCEL_S", "READING_CANCEL_S",
           "abort_message", "abort_phase", "request_tag"]
