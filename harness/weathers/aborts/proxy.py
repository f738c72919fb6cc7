"""The aborts weather's hops in the harness's proxy (harness.serve.proxy.app finds them): a
request whose id carries its tag (``protocol``) goes through its hops up to the phase it is dealt,
then the connection is dropped, the way a client that goes away does; the client gets
:data:`~harness.weathers.aborts.protocol.ABORT_STATUS` naming the phase."""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from harness.serve.proxy.upstream import REQUEST_ID_HEADER, elapsed_ms
from harness.weathers.aborts.protocol import ABORT_STATUS, abort_message, abort_phase

if TYPE_CHECKING:       # the app imports this module, not the other way round
    from harness.serve.proxy.app import Hops


def takes(request_id: str, turn: int) -> str | None:
    """The phase at which this request is cancelled (``turn``: tagged requests before it), or
    None: the proxy's own hops."""
    return abort_phase(request_id, turn)


async def _dropped_stream(hops: "Hops", url: str, body: dict[str, Any], hop: str,
                          after_first_token: bool) -> None:
    """Send ``body`` streamed to ``url`` and drop the connection (vLLM aborts the request) once
    the server took it (its headers came) or, ``after_first_token``, once a token came."""
    record = hops.record
    async with await hops.post(url, hop, {**body, "stream": True}) as response:
        record[f"{hop}_status"] = response.status
        if after_first_token and response.status == 200:
            async for line in response.content:
                if line.startswith(b"data:") and b'"text"' in line:
                    record["abort_tokens_seen"] = True
                    break
        response.close()      # unread: the connection closes, not back to the pool


async def run(hops: "Hops", phase: str) -> web.StreamResponse:
    """The request's hops up to ``phase``, then the connection dropped; the client gets
    ABORT_STATUS naming the phase."""
    record = hops.record
    record["abort_phase"] = phase
    start = time.perf_counter()
    try:
        if phase == "queued":
            await _dropped_stream(hops, record["prefill_url"] + record["endpoint"],
                                  hops.prefill_body(), "prefill", after_first_token=False)
        else:
            ended = await hops.prefill()
            if ended is not None:
                return ended
            if phase != "prefilled":
                await _dropped_stream(hops, record["decode_url"] + record["endpoint"],
                                      hops.decode_body(), "decode",
                                      after_first_token=phase == "decoding")
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        record["abort_upstream_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        record["decode_ms"] = elapsed_ms(start)
    record["error"] = abort_message(phase)
    return web.json_response({"error": {"message": record["error"], "abort_phase": phase}},
                             status=ABORT_STATUS,
                             headers={REQUEST_ID_HEADER: record["request_id"]})


__all__ = ["run", "takes"]
