"""The proxy's side of one upstream hop over HTTP: headers, the POST (with its one retry on a
closed keep-alive connection), a passed-through answer, and the error when no answer came."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
from aiohttp import web

from harness.serve.proxy.hops import forwarded_authorization

log = logging.getLogger("harness.serve.proxy.app")

REQUEST_ID_HEADER = "X-Request-Id"
# Idle upstream connections are dropped after this long: below uvicorn's 5 s keep-alive, so the
# proxy, not the vLLM server, closes them (see post).
UPSTREAM_KEEPALIVE_S = 2.0


class UpstreamUnreachable(Exception):
    """A hop got no HTTP answer: connection refused/reset (502) or timeout (504)."""

    def __init__(self, status: int, message: str, upstream: str, hop: str):
        super().__init__(message)
        self.status = status
        self.message = message
        self.upstream = upstream
        self.hop = hop

    def response(self, request_id: str | None = None) -> web.Response:
        """The JSON error answer the client receives."""
        headers = {REQUEST_ID_HEADER: request_id} if request_id else None
        return web.json_response(
            {"error": {"message": self.message, "upstream": self.upstream, "hop": self.hop}},
            status=self.status,
            headers=headers,
        )


def upstream_headers(request: web.Request, request_id: str, forward_authorization: bool
                     ) -> dict[str, str]:
    # the client's Authorization goes on only when the proxy was started to forward it
    return {REQUEST_ID_HEADER: request_id, "Content-Type": "application/json",
            **forwarded_authorization(request.headers, forward_authorization)}


def unreachable(exc: BaseException, upstream: str, hop: str) -> UpstreamUnreachable:
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamUnreachable(504, f"{hop} server timed out", upstream, hop)
    return UpstreamUnreachable(
        502, f"{hop} server unreachable: {type(exc).__name__}: {exc}", upstream, hop
    )


def elapsed_ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1000.0, 3)


def passthrough(status: int, body: bytes, content_type: str | None, request_id: str) -> web.Response:
    response = web.Response(status=status, body=body, headers={REQUEST_ID_HEADER: request_id})
    # Set after construction: aiohttp would otherwise split "type; charset=..." and complain.
    response.headers["Content-Type"] = content_type or "application/json"
    return response


async def post(session: aiohttp.ClientSession, url: str, record: dict[str, Any], hop: str,
               **kwargs: Any) -> aiohttp.ClientResponse:
    """POST, retrying once when a pooled keep-alive connection turns out to be closed.

    uvicorn closes idle keep-alive connections after 5 s; a request sent on one at that moment
    dies with ServerDisconnectedError before the server read it (measured: a 5.4 s pause between
    two evaluations failed 6 requests of a CPU calibration run). The connector already drops idle
    connections after UPSTREAM_KEEPALIVE_S; this covers the remaining race. Only a disconnect
    before any response byte is retried, so no request is answered twice."""
    try:
        return await session.post(url, **kwargs)
    except aiohttp.ServerDisconnectedError:
        record.setdefault("reconnects", []).append(hop)
        log.info("%s: %s connection to %s was closed by the server; retrying once on a new one",
                 record.get("request_id"), hop, url)
        return await session.post(url, **kwargs)
