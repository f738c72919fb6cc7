"""The harness's own prefill/decode (P/D) router for vLLM's NixlConnector, an aiohttp app.

Every completion request makes two hops under one request id, as vLLM's
``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`` does: prefill (``max_tokens=1``,
``kv_transfer_params={"do_remote_decode": True, ...}``), then decode (the original body plus the
``kv_transfer_params`` prefill answered, so decode pulls the blocks over NIXL; streamed through
unchanged on ``stream=true``). Unlike the toy proxy it records every request (servers, statuses,
kv params received and sent, timings) as the transfer evidence, and it injects the proxy-side
canaries ``drop-transfer`` (decode gets no params) and ``foreign-params`` (the previous
request's). Bodies, faults, records: ``proxy_hops``; run: ``python -m harness.serve.proxy.app``.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import aiohttp
from aiohttp import web

from harness.serve.proxy.hops import (
    PROXY_FAULTS,
    build_decode_body,
    build_prefill_body,
    forwarded_authorization,
    new_record,
    new_request_id,
    tag_for,
    with_cache_salt,
    params_for_decode,
)

log = logging.getLogger("harness.serve.proxy.app")

REQUEST_ID_HEADER = "X-Request-Id"
COMPLETION_ENDPOINTS = ("/v1/completions", "/v1/chat/completions")

# lm-eval prompts with many few-shot examples exceed aiohttp's 1 MiB default body limit.
MAX_REQUEST_BODY_BYTES = 64 * 1024 * 1024
# Idle upstream connections are dropped after this long: below uvicorn's 5 s keep-alive, so the
# proxy, not the vLLM server, closes them (see _post).
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
    forward_authorization: bool = False   # pass the client's Authorization on (else strip it)
    records: list[dict[str, Any]] = field(default_factory=list)
    session: aiohttp.ClientSession | None = None
    # kv_transfer_params of the most recent prefill answer; the foreign-params fault hands them
    # to the next request's decode hop.
    last_received_kv_transfer_params: dict[str, Any] | None = None
    _prefill_rotation: Iterator[str] = field(init=False, repr=False)
    _decode_rotation: Iterator[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.prefill_urls or not self.decode_urls:
            raise ValueError("the proxy needs at least one prefill and one decode URL")
        self.prefill_urls = [url.rstrip("/") for url in self.prefill_urls]
        self.decode_urls = [url.rstrip("/") for url in self.decode_urls]
        self._prefill_rotation = itertools.cycle(self.prefill_urls)
        self._decode_rotation = itertools.cycle(self.decode_urls)

    def next_prefill_url(self) -> str:
        """Round-robin over prefill servers (independent of the decode rotation)."""
        return next(self._prefill_rotation)

    def next_decode_url(self) -> str:
        """Round-robin over decode servers (independent of the prefill rotation)."""
        return next(self._decode_rotation)

    def add_record(self, record: dict[str, Any]) -> None:
        """Keep a record in memory and append it to the JSONL file, flushed per line, so the
        harness can read every finished request even after the proxy was killed."""
        self.records.append(record)
        if self.records_path:
            with open(self.records_path, "a", encoding="utf-8") as records_file:
                records_file.write(json.dumps(record, sort_keys=True) + "\n")
                records_file.flush()


PROXY_STATE_KEY = web.AppKey("pd_proxy_state", ProxyState)


def _upstream_headers(request: web.Request, request_id: str) -> dict[str, str]:
    forward = request.app[PROXY_STATE_KEY].forward_authorization
    return {REQUEST_ID_HEADER: request_id, "Content-Type": "application/json",
            **forwarded_authorization(request.headers, forward)}


def _unreachable(exc: BaseException, upstream: str, hop: str) -> UpstreamUnreachable:
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamUnreachable(504, f"{hop} server timed out", upstream, hop)
    return UpstreamUnreachable(
        502, f"{hop} server unreachable: {type(exc).__name__}: {exc}", upstream, hop
    )


def _elapsed_ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1000.0, 3)


def _passthrough(status: int, body: bytes, content_type: str | None, request_id: str) -> web.Response:
    response = web.Response(status=status, body=body, headers={REQUEST_ID_HEADER: request_id})
    # Set after construction: aiohttp would otherwise split "type; charset=..." and complain.
    response.headers["Content-Type"] = content_type or "application/json"
    return response


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

    original_body = with_cache_salt(original_body, state.cache_salt)
    request_id = new_request_id(tag_for(state.request_tag, original_body))
    headers = _upstream_headers(request, request_id)
    record = new_record(request_id, endpoint, state.next_prefill_url(), state.next_decode_url(),
                        state.fault)
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


async def _post(session: aiohttp.ClientSession, url: str, record: dict[str, Any], hop: str,
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


async def _two_hops(
    request: web.Request,
    state: ProxyState,
    original_body: dict[str, Any],
    headers: dict[str, str],
    record: dict[str, Any],
) -> web.StreamResponse:
    assert state.session is not None
    request_id = record["request_id"]
    endpoint = record["endpoint"]

    # --- prefill hop -------------------------------------------------------------------------
    prefill_url = record["prefill_url"]
    prefill_start = time.perf_counter()
    try:
        async with await _post(state.session, prefill_url + endpoint, record, "prefill",
                               json=build_prefill_body(original_body), headers=headers
                               ) as prefill_response:
            prefill_bytes = await prefill_response.read()
            record["prefill_status"] = prefill_response.status
            prefill_content_type = prefill_response.headers.get("Content-Type")
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise _unreachable(exc, prefill_url, "prefill") from exc
    finally:
        record["prefill_ms"] = _elapsed_ms(prefill_start)

    if record["prefill_status"] != 200:
        # An upstream error goes back unchanged; decode never sees this request.
        record["error"] = "prefill: upstream error"
        return _passthrough(record["prefill_status"], prefill_bytes, prefill_content_type, request_id)
    try:
        prefill_json = json.loads(prefill_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UpstreamUnreachable(502, f"prefill answer is not JSON: {exc}", prefill_url, "prefill") from exc
    received = prefill_json.get("kv_transfer_params") if isinstance(prefill_json, dict) else None
    record["received_kv_transfer_params"] = received
    if received is None:
        log.warning("%s: prefill %s returned no kv_transfer_params; decode will recompute",
                    request_id, prefill_url)

    # --- fault injection -----------------------------------------------------------------------
    # No await between reading and replacing last_received_kv_transfer_params, so concurrent
    # requests each see a distinct predecessor.
    predecessor_params = state.last_received_kv_transfer_params
    state.last_received_kv_transfer_params = received
    sent, record["fault_applied"] = params_for_decode(state.fault, received, predecessor_params)
    record["sent_kv_transfer_params"] = sent

    # --- decode hop ----------------------------------------------------------------------------
    decode_url = record["decode_url"]
    wants_stream = bool(original_body.get("stream", False))
    decode_start = time.perf_counter()
    client_response: web.StreamResponse | None = None
    try:
        async with await _post(state.session, decode_url + endpoint, record, "decode",
                               json=build_decode_body(original_body, sent), headers=headers
                               ) as decode_response:
            record["decode_status"] = decode_response.status
            content_type = decode_response.headers.get("Content-Type")
            if not wants_stream or decode_response.status != 200:
                decode_bytes = await decode_response.read()
                return _passthrough(decode_response.status, decode_bytes, content_type, request_id)
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
        error = _unreachable(exc, decode_url, "decode")
        if client_response is None or not client_response.prepared:
            raise error from exc
        # Headers are already sent: the status cannot change, so end the stream and record why.
        record["error"] = f"decode: stream broken: {error.message}"
        log.warning("%s: decode stream from %s broke: %s", request_id, decode_url, error.message)
        return client_response
    finally:
        record["decode_ms"] = _elapsed_ms(decode_start)


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
        return _unreachable(exc, decode_url, "decode").response()
    passthrough = web.Response(status=response_status, body=body)
    passthrough.headers["Content-Type"] = content_type or "application/json"
    return passthrough


async def _handle_healthcheck(request: web.Request) -> web.Response:
    state = request.app[PROXY_STATE_KEY]
    return web.json_response(
        {"status": "ok", "prefill": state.prefill_urls, "decode": state.decode_urls}
    )


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
    forward_authorization: bool = False,
) -> web.Application:
    """Build the P/D proxy application.

    prefill_urls / decode_urls: base URLs (``http://127.0.0.1:8100``), each list round-robined
    independently. fault: ``drop-transfer`` or ``foreign-params`` are applied here; any other name
    is only recorded. records_path: JSONL file that every request's record is appended to.
    timeout_s: total time allowed per upstream hop before answering 504.
    """
    state = ProxyState(prefill_urls=list(prefill_urls), decode_urls=list(decode_urls), fault=fault,
                       records_path=records_path, timeout_s=timeout_s, request_tag=request_tag,
                       cache_salt=cache_salt, forward_authorization=forward_authorization)
    app = web.Application(client_max_size=MAX_REQUEST_BODY_BYTES)
    app[PROXY_STATE_KEY] = state

    async def open_session(_app: web.Application) -> None:
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
    parser.add_argument("--fault", default=None,
                        help=f"fault to inject ({', '.join(PROXY_FAULTS)} here; others only recorded)")
    parser.add_argument("--request-tag", default="", help="text in every request id, e.g. "
                        "fault.corrupt-block.2.zero. (the decode's fault plugin reads it)")
    parser.add_argument("--cache-salt", default=None, help="vLLM cache_salt for every request")
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
                     cache_salt=args.cache_salt,
                     forward_authorization=args.forward_authorization)
    log.info("pd proxy on http://%s:%d prefill=%s decode=%s fault=%s records=%s",
             args.host, args.port, args.prefill, args.decode, args.fault, args.records)
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
