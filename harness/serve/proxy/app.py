"""The harness's own prefill/decode (P/D) router for vLLM's KV connectors, an aiohttp app.

Every completion request makes two hops under one request id, as vLLM's toy proxies do: prefill
(``max_tokens=1``, the connector's prefill ``kv_transfer_params``), then decode (the original
body plus the params the connector makes of the prefill's answer, so the KV crosses; streamed
through unchanged on ``stream=true``). What the params are and how they travel is the
connector's (harness.connectors, ``--kv-connector``). Unlike the toy proxies it records
every request (servers, statuses, kv params received and sent, timings) as the transfer
evidence, and it injects the proxy-side canaries ``drop-transfer`` (decode gets no params),
``foreign-params`` (the previous request's) and ``idle-instance`` (every request to the first
prefill and the first decode). Bodies, faults, records: ``hops``; run:
``python -m harness.serve.proxy.app``.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import importlib.util
import itertools
import json
import logging
import os
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, AsyncContextManager, Awaitable, Iterator, Mapping

import aiohttp
from aiohttp import web

from harness import weathers
from harness.connectors import DEFAULT_KV_CONNECTOR, connector_for, driven_connectors
from harness.connectors.driver import KvConnector
from harness.core.prompts import prompt_hash
from harness.serve.proxy.upstream import (
    REQUEST_ID_HEADER,
    UPSTREAM_KEEPALIVE_S,
    UpstreamUnreachable,
    elapsed_ms,
    passthrough,
    post,
    unreachable,
    upstream_headers,
)
from harness.serve.proxy.hops import (
    FAULT_IDLE_INSTANCE,
    PROXY_FAULTS,
    build_decode_body,
    build_prefill_body,
    forwarded_authorization,
    answer_of,
    new_record,
    new_request_id,
    tag_for,
    with_cache_salt,
    params_for_decode,
)

log = logging.getLogger("harness.serve.proxy.app")

COMPLETION_ENDPOINTS = ("/v1/completions", "/v1/chat/completions")

# lm-eval prompts with many few-shot examples exceed aiohttp's 1 MiB default body limit.
MAX_REQUEST_BODY_BYTES = 64 * 1024 * 1024


@dataclass
class ProxyState:
    """Everything one proxy app holds: upstreams, rotation, fault, records, the client session."""

    prefill_urls: list[str]
    decode_urls: list[str]
    fault: str | None = None
    records_path: str | None = None
    timeout_s: float = 600
    request_tag: str = ""              # put in every request id (the decode's per-request fault)
    cache_salt: str | None = None
    connector: KvConnector = field(default_factory=connector_for)   # how the params travel
    forward_authorization: bool = False   # pass the client's Authorization on (else strip it)
    # prefill URL -> its connector side channel "host:port" (a connector whose prefill answers no
    # params names the transfer from it: its bootstrap server)
    prefill_sides: dict[str, str] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    session: aiohttp.ClientSession | None = None
    # cleared while a server restarts (the restart weather, POST /pd/hold): new requests wait,
    # as behind a router that drains a restarting server, instead of meeting a closed port
    admitting: asyncio.Event | None = None
    # requests each weather's hops took so far, by its module (it deals them out in turn)
    weather_turns: dict[str, int] = field(default_factory=dict)
    requests_seen: int = 0             # requests so far, in arrival order (a late fault's count)
    # kv_transfer_params of the most recent prefill answer; the foreign-params fault hands them
    # to the next request's decode hop.
    last_received_kv_transfer_params: dict[str, Any] | None = None
    _prefill_rotation: Iterator[str] = field(init=False, repr=False)
    _decode_rotation: Iterator[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.prefill_urls or not self.decode_urls:
            raise ValueError("the proxy needs at least one prefill and one decode URL")
        self.prefill_urls = [url.rstrip("/") for url in self.prefill_urls]
        self.prefill_sides = {url.rstrip("/"): side for url, side in self.prefill_sides.items()}
        self.decode_urls = [url.rstrip("/") for url in self.decode_urls]
        self._prefill_rotation = itertools.cycle(self.prefill_urls)
        self._decode_rotation = itertools.cycle(self.decode_urls)

    def next_prefill_url(self) -> str:
        """Round-robin over prefill servers (independent of the decode rotation)."""
        url = next(self._prefill_rotation)
        return self.prefill_urls[0] if self.fault == FAULT_IDLE_INSTANCE else url

    def next_decode_url(self) -> str:
        """Round-robin over decode servers (independent of the prefill rotation)."""
        url = next(self._decode_rotation)
        return self.decode_urls[0] if self.fault == FAULT_IDLE_INSTANCE else url

    def add_record(self, record: dict[str, Any]) -> None:
        """Keep a record in memory and append it to the JSONL file, flushed per line, so the
        harness can read every finished request even after the proxy was killed."""
        self.records.append(record)
        if self.records_path:
            with open(self.records_path, "a", encoding="utf-8") as records_file:
                records_file.write(json.dumps(record, sort_keys=True) + "\n")
                records_file.flush()


PROXY_STATE_KEY = web.AppKey("pd_proxy_state", ProxyState)


async def _handle_completion(request: web.Request) -> web.StreamResponse:
    state = request.app[PROXY_STATE_KEY]
    assert state.session is not None, "the client session is created on app startup"
    endpoint = request.path
    try:
        original_body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return web.json_response({"error": {"message": f"request body is not JSON: {exc}"}}, status=400)
    if not isinstance(original_body, dict):
        return web.json_response({"error": {"message": "request body must be a JSON object"}}, status=400)

    if state.admitting is not None:
        await state.admitting.wait()
    original_body = with_cache_salt(original_body, state.cache_salt)
    index, state.requests_seen = state.requests_seen, state.requests_seen + 1
    request_id = new_request_id(tag_for(state.request_tag, original_body, index))
    headers = upstream_headers(request, request_id, state.forward_authorization)
    record = new_record(request_id, endpoint, state.next_prefill_url(), state.next_decode_url(),
                        state.fault, state.connector.value)
    record["index"] = index
    prompt = original_body.get("prompt")
    # the client's question (harness.eval.lmeval) joins its request through this under weather
    record["prompt_hash"] = prompt_hash(prompt) if isinstance(prompt, str) else None
    children = original_body.get("n")
    record["n"] = children if isinstance(children, int) and children > 1 else 1
    try:
        return await _two_hops(request, state, original_body, headers, record)
    except UpstreamUnreachable as exc:
        record["error"] = f"{exc.hop}: {exc.message}"
        return exc.response(request_id)
    finally:
        state.add_record(record)
        log.info(
            "%s %s prefill=%s (%s ms) decode=%s (%s ms) fault=%s applied=%s%s",
            request_id, endpoint, record["prefill_status"], record["prefill_ms"],
            record["decode_status"], record["decode_ms"], state.fault, record["fault_applied"],
            f" error={record['error']}" if record["error"] else "",
        )


async def _prefill_hop(state: ProxyState, original_body: dict[str, Any], headers: dict[str, str],
                      record: dict[str, Any]) -> web.Response | None:
    """The prefill hop: records its status and the params it answered; returns the client's
    answer when it ends the request (an upstream error goes back unchanged), else None."""
    assert state.session is not None
    prefill_url = record["prefill_url"]
    prefill_start = time.perf_counter()
    sent = state.connector.prefill_params_for(record["request_id"])
    body = build_prefill_body(original_body, sent)
    try:
        async with await post(state.session, prefill_url + record["endpoint"], record, "prefill",
                               json=body, headers=headers) as prefill_response:
            prefill_bytes = await prefill_response.read()
            record["prefill_status"] = prefill_response.status
            prefill_content_type = prefill_response.headers.get("Content-Type")
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise unreachable(exc, prefill_url, "prefill") from exc
    finally:
        record["prefill_ms"] = elapsed_ms(prefill_start)

    if record["prefill_status"] != 200:
        # decode never sees this request
        record["error"] = "prefill: upstream error"
        return passthrough(record["prefill_status"], prefill_bytes, prefill_content_type,
                            record["request_id"])
    try:
        prefill_json = json.loads(prefill_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UpstreamUnreachable(502, f"prefill answer is not JSON: {exc}", prefill_url, "prefill") from exc
    received = prefill_json.get("kv_transfer_params") if isinstance(prefill_json, dict) else None
    usage = prefill_json.get("usage") if isinstance(prefill_json, dict) else None
    record["prompt_tokens"] = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    record["received_kv_transfer_params"] = received
    if not state.connector.prefill_answers_params:
        record["kv_transfer_handle"] = state.connector.prefill_answer(
            received, sent=sent, side=state.prefill_sides.get(prefill_url))
    elif received is None:
        log.warning("%s: prefill %s returned no kv_transfer_params; decode will recompute",
                    record["request_id"], prefill_url)
    return None


def _decode_params(state: ProxyState, record: dict[str, Any]) -> dict[str, Any] | None:
    """The decode hop's params: the connector's from this request's prefill answer, or what a
    proxy-side canary makes of them (the previous request's, none)."""
    received = answer_of(record)
    # No await between reading and replacing last_received_kv_transfer_params, so concurrent
    # requests each see a distinct predecessor.
    predecessor = state.last_received_kv_transfer_params
    state.last_received_kv_transfer_params = received
    own = state.connector.decode_params(received)
    foreign = None if predecessor is None else state.connector.decode_params(predecessor)
    sent, applied = params_for_decode(state.fault, own, foreign)
    # idle-instance acts on the routing: every request of the canary is routed by it
    record["fault_applied"] = applied or state.fault == FAULT_IDLE_INSTANCE
    record["sent_kv_transfer_params"] = sent
    return sent


async def _two_hops(
    request: web.Request,
    state: ProxyState,
    original_body: dict[str, Any],
    headers: dict[str, str],
    record: dict[str, Any],
) -> web.StreamResponse:
    assert state.session is not None
    request_id = record["request_id"]
    for hops in weather_hops():
        turn = state.weather_turns.get(hops.__name__, 0)
        taken = hops.takes(request_id, turn)
        if taken is not None:
            state.weather_turns[hops.__name__] = turn + 1
            return await hops.run(Hops(state, original_body, headers, record), taken)
    ended = await _prefill_hop(state, original_body, headers, record)
    if ended is not None:
        return ended
    sent = _decode_params(state, record)

    decode_url = record["decode_url"]
    wants_stream = bool(original_body.get("stream", False))
    decode_start = time.perf_counter()
    client_response: web.StreamResponse | None = None
    try:
        async with await post(state.session, decode_url + record["endpoint"], record, "decode",
                               json=build_decode_body(original_body, sent), headers=headers
                               ) as decode_response:
            record["decode_status"] = decode_response.status
            content_type = decode_response.headers.get("Content-Type")
            if not wants_stream or decode_response.status != 200:
                decode_bytes = await decode_response.read()
                return passthrough(decode_response.status, decode_bytes, content_type, request_id)
            client_response = web.StreamResponse(
                status=200, headers={REQUEST_ID_HEADER: request_id}
            )
            client_response.headers["Content-Type"] = content_type or "text/event-stream"
            client_response.headers["Cache-Control"] = "no-cache"
            await client_response.prepare(request)
            async for chunk in decode_response.content.iter_any():
                await client_response.write(chunk)
            await client_response.write_eof()
            return client_response
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        error = unreachable(exc, decode_url, "decode")
        if client_response is None or not client_response.prepared:
            raise error from exc
        # Headers are already sent: the status cannot change, so end the stream and record why.
        record["error"] = f"decode: stream broken: {error.message}"
        log.warning("%s: decode stream from %s broke: %s", request_id, decode_url, error.message)
        return client_response
    finally:
        record["decode_ms"] = elapsed_ms(decode_start)


@dataclass
class Hops:
    """What a weather's hops in the proxy (its package's ``proxy`` module) may do with one
    request: the two hops as the proxy makes them, the request's record, and a streamed post
    whose connection it can drop."""

    state: ProxyState
    body: dict[str, Any]            # the client's request
    headers: dict[str, str]
    record: dict[str, Any]          # this request's proxy record

    def prefill_body(self) -> dict[str, Any]:
        return build_prefill_body(self.body, self.state.connector.prefill_params)

    def prefill(self) -> Awaitable[web.StreamResponse | None]:
        """The prefill hop as the proxy makes it (None: answered, the decode may follow)."""
        return _prefill_hop(self.state, self.body, self.headers, self.record)

    def decode_body(self) -> dict[str, Any]:
        """The decode hop's body with the params the connector makes of the prefill's answer."""
        return build_decode_body(self.body, _decode_params(self.state, self.record))

    def post(self, url: str, hop: str, body: dict[str, Any]) -> Awaitable[AsyncContextManager]:
        assert self.state.session is not None
        return post(self.state.session, url, self.record, hop, json=body, headers=self.headers)


def weather_hops() -> tuple[ModuleType, ...]:
    """Each weather package's hops in this proxy (its ``proxy`` module: ``takes(request_id,
    turn)`` names what it does with a request, or None; ``run(hops, what)`` does it)."""
    return _hops_of(weathers.packages())


@functools.lru_cache(maxsize=None)
def _hops_of(packages: tuple[ModuleType, ...]) -> tuple[ModuleType, ...]:
    names = [f"{package.__name__}.proxy" for package in packages]
    return tuple(importlib.import_module(name) for name in names
                 if importlib.util.find_spec(name) is not None)


async def _handle_models(request: web.Request) -> web.Response:
    """Pass GET /v1/models through to the first decode server (both roles serve the same model;
    the rotation is left alone so it stays predictable for completions)."""
    state = request.app[PROXY_STATE_KEY]
    assert state.session is not None
    decode_url = state.decode_urls[0]
    headers = forwarded_authorization(request.headers, state.forward_authorization)
    try:
        async with state.session.get(
            decode_url + "/v1/models", params=request.query, headers=headers
        ) as response:
            body = await response.read()
            response_status = response.status
            content_type = response.headers.get("Content-Type")
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return unreachable(exc, decode_url, "decode").response()
    passthrough = web.Response(status=response_status, body=body)
    passthrough.headers["Content-Type"] = content_type or "application/json"
    return passthrough


async def _handle_healthcheck(request: web.Request) -> web.Response:
    state = request.app[PROXY_STATE_KEY]
    return web.json_response(
        {"status": "ok", "prefill": state.prefill_urls, "decode": state.decode_urls}
    )


async def _handle_hold(request: web.Request) -> web.Response:
    """POST /pd/hold: new requests wait (in-flight ones go on); /pd/release lets them in."""
    state = request.app[PROXY_STATE_KEY]
    assert state.admitting is not None
    if request.path.endswith("/hold"):
        state.admitting.clear()
    else:
        state.admitting.set()
    return web.json_response({"admitting": state.admitting.is_set()})


async def _handle_records(request: web.Request) -> web.Response:
    return web.json_response(request.app[PROXY_STATE_KEY].records)


def create_app(
    prefill_urls: list[str],
    decode_urls: list[str],
    *,
    fault: str | None = None,
    records_path: str | None = None,
    timeout_s: float = 600,
    request_tag: str = "",
    cache_salt: str | None = None,
    kv_connector: str = DEFAULT_KV_CONNECTOR,
    forward_authorization: bool = False,
    prefill_sides: Mapping[str, str] | None = None,
) -> web.Application:
    """Build the P/D proxy application.

    prefill_urls / decode_urls: base URLs (``http://127.0.0.1:8100``), each list round-robined
    independently. fault: ``drop-transfer`` or ``foreign-params`` are applied here; any other name
    is only recorded. records_path: JSONL file that every request's record is appended to.
    timeout_s: total time allowed per upstream hop before answering 504. kv_connector: the
    harness.connectors value whose params the hops carry. prefill_sides: each prefill
    URL's connector side channel ``host:port`` (for a connector whose prefill answers no params).
    """
    state = ProxyState(
        prefill_urls=list(prefill_urls),
        decode_urls=list(decode_urls),
        fault=fault,
        records_path=records_path,
        timeout_s=timeout_s,
        request_tag=request_tag,
        cache_salt=cache_salt,
        connector=connector_for(kv_connector),
        forward_authorization=forward_authorization,
        prefill_sides=dict(prefill_sides or {}),
    )
    app = web.Application(client_max_size=MAX_REQUEST_BODY_BYTES)
    app[PROXY_STATE_KEY] = state

    async def open_session(_app: web.Application) -> None:
        state.admitting = asyncio.Event()
        state.admitting.set()
        if state.records_path:
            os.makedirs(os.path.dirname(os.path.abspath(state.records_path)), exist_ok=True)
        # limit=0: the proxy must not become a hidden queue in front of the servers.
        state.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=UPSTREAM_KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(total=state.timeout_s),
        )

    async def close_session(_app: web.Application) -> None:
        if state.session is not None:
            await state.session.close()
            state.session = None

    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    for endpoint in COMPLETION_ENDPOINTS:
        app.router.add_post(endpoint, _handle_completion)
    app.router.add_get("/v1/models", _handle_models)
    app.router.add_get("/healthcheck", _handle_healthcheck)
    app.router.add_get("/pd/records", _handle_records)
    app.router.add_post("/pd/hold", _handle_hold)
    app.router.add_post("/pd/release", _handle_hold)
    return app


def build_arg_parser() -> argparse.ArgumentParser:
    """Command line of ``python -m harness.serve.proxy.app``."""
    parser = argparse.ArgumentParser(prog="python -m harness.serve.proxy.app", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--prefill", action="append", required=True, metavar="URL",
                        help="prefill server base URL; repeat for several")
    parser.add_argument("--decode", action="append", required=True, metavar="URL",
                        help="decode server base URL; repeat for several")
    parser.add_argument("--prefill-side", action="append", default=[], metavar="URL=HOST:PORT",
                        help="a prefill's connector side channel (e.g. its bootstrap server)")
    parser.add_argument("--fault", default=None,
                        help=f"fault to inject ({', '.join(PROXY_FAULTS)} here; others only recorded)")
    parser.add_argument("--request-tag", default="", help="text in every request id, e.g. "
                        "fault.corrupt-block.2.zero. (the decode's fault plugin reads it)")
    parser.add_argument("--cache-salt", default=None, help="vLLM cache_salt for every request")
    parser.add_argument("--kv-connector", default=DEFAULT_KV_CONNECTOR, choices=driven_connectors(),
                        help="the pair's KV connector: how kv_transfer_params travel")
    parser.add_argument("--records", default=None, metavar="PATH",
                        help="append one JSON line per request to this file")
    parser.add_argument("--forward-authorization", action="store_true", help="pass the client's "
                        "Authorization on to the servers (else stripped)")
    parser.add_argument("--timeout", type=float, default=600, metavar="S",
                        help="seconds per upstream hop before answering 504")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the proxy until SIGINT/SIGTERM."""
    args = build_arg_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = create_app(args.prefill, args.decode, fault=args.fault, records_path=args.records,
                     timeout_s=args.timeout, request_tag=args.request_tag,
                     cache_salt=args.cache_salt, kv_connector=args.kv_connector,
                     forward_authorization=args.forward_authorization,
                     prefill_sides=dict(item.rsplit("=", 1) for item in args.prefill_side))
    log.info("pd proxy on http://%s:%d prefill=%s decode=%s connector=%s fault=%s records=%s",
             args.host, args.port, args.prefill, args.decode, args.kv_connector, args.fault,
             args.records)
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
