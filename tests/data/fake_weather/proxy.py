"""The made-up weather's hops in the proxy: a tagged request gets its prefill hop, then an
answer of the weather's own instead of the decode's."""
from __future__ import annotations

from aiohttp import web

from tests.data.fake_weather.driver import TAG


def takes(request_id: str, turn: int) -> str | None:
    return f"drop {turn}" if TAG in request_id else None


async def run(hops, what: str) -> web.StreamResponse:
    ended = await hops.prefill()
    if ended is not None:
        return ended
    hops.record["drizzled"] = what
    return web.json_response({"drizzled": what}, status=418)
