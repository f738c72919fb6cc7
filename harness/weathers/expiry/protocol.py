"""The words of the expiry weather's late read: the tag a request's id carries to ask for one,
and the lines the decode writes for each request it holds (written by its ``in_server`` part,
read back by its ``driver``; standard library only, as harness.protocol)."""
from __future__ import annotations

import re
from dataclasses import dataclass

KIND = "late-read"
HELD_PREFIX = "pd-accuracy late-read:"
_TAG_RE = re.compile(r"wx\.late-read\.(?P<delay_ms>\d+)\.")
_LINE_RE = re.compile(
    r"pd-accuracy late-read: (?P<event>held|released) request=(?P<request>\S+) "
    r"delay_ms=(?P<delay_ms>\d+)(?: waited_ms=(?P<waited_ms>\d+))?(?: heartbeat=(?P<hb>\S+))?")


def request_tag(delay_ms: int) -> str:
    """What a late-read request's id carries after ``pdacc-`` (the proxy's request tag)."""
    if delay_ms <= 0:
        raise ValueError(f"late-read delay {delay_ms} ms: expected a positive delay")
    return f"wx.{KIND}.{int(delay_ms)}."


def parse_delay_ms(request_id: str) -> int | None:
    """The read delay a request id asks for, or None for a request to read at once."""
    match = _TAG_RE.search(request_id)
    return int(match["delay_ms"]) if match else None


def held_line(request_id: str, delay_ms: int, heartbeat: str) -> str:
    """The line of a request held back from its connector (``heartbeat``: what became of its
    lease renewals)."""
    return f"{HELD_PREFIX} held request={request_id} delay_ms={delay_ms:d} heartbeat={heartbeat}"


def released_line(request_id: str, delay_ms: int, waited_ms: int) -> str:
    """The line of a held request let through to its read after ``waited_ms``."""
    return (f"{HELD_PREFIX} released request={request_id} delay_ms={delay_ms:d} "
            f"waited_ms={waited_ms:d}")


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
