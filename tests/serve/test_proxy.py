"""harness.serve.proxy.app against fake prefill/decode servers (aiohttp apps on ephemeral ports).

No pytest-asyncio: each test drives its scenario with asyncio.run and aiohttp's test utilities.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, AsyncIterator

import port_for
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from harness.serve.proxy.app import create_app

REPO_ROOT = Path(__file__).resolve().parents[2]
REQUEST_ID_PATTERN = re.compile(r"^pdacc-[0-9a-f]{32}$")
EXPECTED_PREFILL_KV_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
RECORD_KEYS = {
    "request_id", "endpoint", "prefill_url", "decode_url", "prefill_status", "decode_status",
    "received_kv_transfer_params", "sent_kv_transfer_params", "fault", "fault_applied",
    "prefill_ms", "decode_ms", "started_at", "prompt_tokens",
}


class FakeUpstream:
    """A fake vLLM server in one role. Remembers every request it got, in order, and appends
    (role, name) to a log shared by all fakes of a test so hop order can be asserted."""

    def __init__(
        self,
        role: str,
        name: str,
        hop_log: list[tuple[str, str]],
        *,
        error_status: int | None = None,
        error_body: bytes = b"",
        sse_chunks: list[bytes] | None = None,
        hold: asyncio.Event | None = None,
    ):
        self.role = role
        self.name = name
        self.hop_log = hop_log
        self.error_status = error_status
        self.error_body = error_body
        self.sse_chunks = sse_chunks or []
        # When set, the decode stream stops after its first chunk until the event is set
        # (streaming test) / the handler waits before answering at all (timeout test).
        self.hold = hold
        self.requests: list[dict[str, Any]] = []
        self.server: TestServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://{self.server.host}:{self.server.port}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        self.requests.append({"path": request.path, "headers": request.headers.copy(), "json": None})
        return web.json_response({"object": "list", "data": [{"id": f"model-of-{self.name}"}]})

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({"path": request.path, "headers": request.headers.copy(), "json": body})
        self.hop_log.append((self.role, self.name))
        if self.error_status is not None:
            return web.Response(status=self.error_status, body=self.error_body,
                                content_type="application/json")
        if self.role == "prefill":
            # Params unique per (server, request) so a test can tell whose params decode got.
            return web.json_response({
                "id": "cmpl-prefill",
                "choices": [{"index": 0, "text": "x"}],
                "usage": {"prompt_tokens": 512, "completion_tokens": 1, "total_tokens": 513},
                "kv_transfer_params": {
                    "do_remote_prefill": True,
                    "do_remote_decode": False,
                    "remote_engine_id": f"engine-{self.name}",
                    "remote_block_ids": [len(self.requests), 100 + len(self.requests)],
                    "remote_host": "127.0.0.1",
                    "remote_port": 5600,
                    "tp_size": 1,
                },
            })
        if self.hold is not None and not body.get("stream"):
            await self.hold.wait()
        if body.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for index, chunk in enumerate(self.sse_chunks):
                await response.write(chunk)
                if index == 0 and self.hold is not None:
                    await self.hold.wait()
            await response.write_eof()
            return response
        return web.json_response({
            "id": "cmpl-decode",
            "choices": [{"index": 0, "text": f"decoded by {self.name}"}],
            "seen_kv_transfer_params": body.get("kv_transfer_params"),
        })


@contextlib.asynccontextmanager
async def proxied(
    prefills: list[FakeUpstream], decodes: list[FakeUpstream], **proxy_kwargs: Any
) -> AsyncIterator[TestClient]:
    """Start the fakes, then a proxy in front of them; yield a client of the proxy."""
    for fake in prefills + decodes:
        fake.server = TestServer(fake.app())
        await fake.server.start_server()
    try:
        app = create_app([f.url for f in prefills], [f.url for f in decodes], **proxy_kwargs)
        async with TestClient(TestServer(app)) as client:
            yield client
    finally:
        for fake in prefills + decodes:
            if fake.hold is not None:
                fake.hold.set()
            await fake.server.close()


def pair(hop_log: list[tuple[str, str]], **decode_kwargs: Any) -> tuple[FakeUpstream, FakeUpstream]:
    return FakeUpstream("prefill", "p0", hop_log), FakeUpstream("decode", "d0", hop_log, **decode_kwargs)


def free_refused_url() -> str:
    """A localhost URL nobody listens on."""
    return f"http://127.0.0.1:{port_for.select_random()}"


def test_two_hops_bodies_order_and_request_id() -> None:
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log)
        original = {"model": "m", "prompt": "2+2=", "max_tokens": 17, "temperature": 0.0,
                    "logprobs": 1}
        async with proxied([prefill], [decode], forward_authorization=True) as client:
            response = await client.post("/v1/completions", json=original,
                                         headers={"Authorization": "Bearer secret"})
            assert response.status == 200
            answer = await response.json()
            client_request_id = response.headers["X-Request-Id"]

        assert hop_log == [("prefill", "p0"), ("decode", "d0")]
        prefill_seen, decode_seen = prefill.requests[0], decode.requests[0]
        assert prefill_seen["path"] == decode_seen["path"] == "/v1/completions"
        assert prefill_seen["json"] == {**original, "max_tokens": 1, "stream": False,
                                        "kv_transfer_params": EXPECTED_PREFILL_KV_PARAMS}
        prefill_params = {
            "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "engine-p0",
            "remote_block_ids": [1, 101], "remote_host": "127.0.0.1", "remote_port": 5600,
            "tp_size": 1,
        }
        assert decode_seen["json"] == {**original, "kv_transfer_params": prefill_params}
        request_id = prefill_seen["headers"]["X-Request-Id"]
        assert REQUEST_ID_PATTERN.match(request_id)
        assert decode_seen["headers"]["X-Request-Id"] == request_id == client_request_id
        assert prefill_seen["headers"]["Authorization"] == "Bearer secret"
        assert decode_seen["headers"]["Authorization"] == "Bearer secret"
        assert answer["choices"][0]["text"] == "decoded by d0"

    asyncio.run(scenario())


def test_chat_completions_two_hops() -> None:
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log)
        original = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                    "max_completion_tokens": 50, "min_tokens": 5}
        async with proxied([prefill], [decode]) as client:
            response = await client.post("/v1/chat/completions", json=original)
            assert response.status == 200
            assert (await response.json())["choices"][0]["text"] == "decoded by d0"

        assert hop_log == [("prefill", "p0"), ("decode", "d0")]
        assert prefill.requests[0]["path"] == decode.requests[0]["path"] == "/v1/chat/completions"
        prefill_body = prefill.requests[0]["json"]
        assert prefill_body["max_tokens"] == 1 and prefill_body["max_completion_tokens"] == 1
        assert "min_tokens" not in prefill_body  # vLLM rejects min_tokens > max_tokens
        decode_body = decode.requests[0]["json"]
        assert decode_body["max_completion_tokens"] == 50 and decode_body["min_tokens"] == 5
        assert "max_tokens" not in decode_body
        assert decode_body["kv_transfer_params"]["remote_engine_id"] == "engine-p0"

    asyncio.run(scenario())


def test_streaming_passes_chunks_through_as_they_arrive() -> None:
    chunks = [b'data: {"choices":[{"text":"A"}]}\n\n', b'data: {"choices":[{"text":"B"}]}\n\n',
              b'data: {"choices":[{"text":"C"}]}\n\n', b"data: [DONE]\n\n"]

    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        release_rest = asyncio.Event()
        prefill, decode = pair(hop_log, sse_chunks=chunks, hold=release_rest)
        original = {"model": "m", "prompt": "p", "max_tokens": 8, "stream": True,
                    "stream_options": {"include_usage": True}}
        async with proxied([prefill], [decode]) as client:
            # The fake holds the rest back until the first chunk reached the client: a proxy
            # that buffered the whole stream would time out here.
            response = await asyncio.wait_for(client.post("/v1/completions", json=original),
                                              timeout=5)
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), timeout=5)
            assert first == chunks[0]
            release_rest.set()
            rest = await asyncio.wait_for(response.content.read(), timeout=5)
            assert first + rest == b"".join(chunks)

        prefill_body = prefill.requests[0]["json"]
        assert prefill_body["stream"] is False and "stream_options" not in prefill_body
        decode_body = decode.requests[0]["json"]
        assert decode_body["stream"] is True
        assert decode_body["stream_options"] == {"include_usage": True}
        assert decode_body["max_tokens"] == 8

    asyncio.run(scenario())


def test_round_robin_is_independent_per_role() -> None:
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefills = [FakeUpstream("prefill", f"p{i}", hop_log) for i in range(2)]
        decodes = [FakeUpstream("decode", f"d{i}", hop_log) for i in range(2)]
        async with proxied(prefills, decodes) as client:
            for _ in range(4):
                response = await client.post("/v1/completions",
                                             json={"model": "m", "prompt": "p", "max_tokens": 3})
                assert response.status == 200
            records = await (await client.get("/pd/records")).json()
            prefill_urls, decode_urls = [f.url for f in prefills], [f.url for f in decodes]

        assert [len(f.requests) for f in prefills + decodes] == [2, 2, 2, 2]
        assert [r["prefill_url"] for r in records] == prefill_urls * 2
        assert [r["decode_url"] for r in records] == decode_urls * 2

    asyncio.run(scenario())


def test_fault_idle_instance_routes_everything_to_the_first_of_each_role() -> None:
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefills = [FakeUpstream("prefill", f"p{i}", hop_log) for i in range(2)]
        decodes = [FakeUpstream("decode", f"d{i}", hop_log) for i in range(2)]
        async with proxied(prefills, decodes, fault="idle-instance") as client:
            for _ in range(4):
                response = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
                assert response.status == 200
            records = await (await client.get("/pd/records")).json()
            first_decode = decodes[0].url

        assert [len(f.requests) for f in prefills + decodes] == [4, 0, 4, 0]
        assert {r["decode_url"] for r in records} == {first_decode}
        # the KV still crosses: only the routing is the fault's
        assert all(r["sent_kv_transfer_params"] == r["received_kv_transfer_params"] for r in records)
        assert all(r["fault"] == "idle-instance" and r["fault_applied"] for r in records)

    asyncio.run(scenario())


def test_parallel_sampling_is_prefilled_once_and_its_children_are_recorded() -> None:
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log)
        async with proxied([prefill], [decode]) as client:
            body = {"model": "m", "prompt": "p", "n": 3, "best_of": 3, "temperature": 1.0}
            assert (await client.post("/v1/completions", json=body)).status == 200
            assert (await client.post("/v1/completions", json={"model": "m", "prompt": "q"})
                    ).status == 200
            records = await (await client.get("/pd/records")).json()

        # one prefill of the prompt; the decode spawns the children from its one transfer
        assert prefill.requests[0]["json"]["n"] == 1 and "best_of" not in prefill.requests[0]["json"]
        assert decode.requests[0]["json"]["n"] == 3
        assert [r["n"] for r in records] == [3, 1]

    asyncio.run(scenario())


def test_prefill_error_is_returned_unchanged_and_decode_never_called() -> None:
    error_body = b'{"error": {"message": "prompt too long", "code": 400}}'

    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill = FakeUpstream("prefill", "p0", hop_log, error_status=400, error_body=error_body)
        decode = FakeUpstream("decode", "d0", hop_log)
        async with proxied([prefill], [decode]) as client:
            response = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
            assert response.status == 400
            assert await response.read() == error_body
            records = await (await client.get("/pd/records")).json()
        assert decode.requests == []
        assert records[0]["prefill_status"] == 400 and records[0]["decode_status"] is None

    asyncio.run(scenario())


def test_decode_error_is_returned_unchanged() -> None:
    error_body = b'{"error": {"message": "engine dead"}}'

    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill = FakeUpstream("prefill", "p0", hop_log)
        decode = FakeUpstream("decode", "d0", hop_log, error_status=500, error_body=error_body)
        async with proxied([prefill], [decode]) as client:
            response = await client.post("/v1/completions",
                                         json={"model": "m", "prompt": "p", "stream": True})
            assert response.status == 500
            assert await response.read() == error_body
            records = await (await client.get("/pd/records")).json()
        assert records[0]["prefill_status"] == 200 and records[0]["decode_status"] == 500

    asyncio.run(scenario())


def test_connection_refused_names_the_hop() -> None:
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        refused_url = free_refused_url()
        # Prefill unreachable.
        decode = FakeUpstream("decode", "d0", hop_log)
        decode.server = TestServer(decode.app())
        await decode.server.start_server()
        try:
            app = create_app([refused_url], [decode.url])
            async with TestClient(TestServer(app)) as client:
                response = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
                assert response.status == 502
                error = (await response.json())["error"]
                assert error["hop"] == "prefill" and error["upstream"] == refused_url
                assert error["message"]
        finally:
            await decode.server.close()
        assert decode.requests == []

        # Decode unreachable, after a successful prefill.
        prefill = FakeUpstream("prefill", "p0", hop_log)
        prefill.server = TestServer(prefill.app())
        await prefill.server.start_server()
        try:
            app = create_app([prefill.url], [refused_url])
            async with TestClient(TestServer(app)) as client:
                response = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
                assert response.status == 502
                error = (await response.json())["error"]
                assert error["hop"] == "decode" and error["upstream"] == refused_url
                records = await (await client.get("/pd/records")).json()
        finally:
            await prefill.server.close()
        assert len(prefill.requests) == 1
        assert records[0]["prefill_status"] == 200 and records[0]["decode_status"] is None
        assert "decode" in records[0]["error"]

    asyncio.run(scenario())


def test_decode_timeout_gives_504() -> None:
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log, hold=asyncio.Event())
        async with proxied([prefill], [decode], timeout_s=0.3) as client:
            response = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
            assert response.status == 504
            error = (await response.json())["error"]
            assert error["hop"] == "decode" and error["upstream"] == decode.url

    asyncio.run(scenario())


def test_healthcheck_lists_upstreams() -> None:
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log)
        async with proxied([prefill], [decode]) as client:
            response = await client.get("/healthcheck")
            assert response.status == 200
            assert await response.json() == {"status": "ok", "prefill": [prefill.url],
                                              "decode": [decode.url]}
        assert hop_log == []  # a health check touches no upstream

    asyncio.run(scenario())


def test_records_endpoint_and_jsonl_file(tmp_path: Path) -> None:
    records_path = tmp_path / "sub" / "records.jsonl"

    async def scenario() -> list[dict[str, Any]]:
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log)
        async with proxied([prefill], [decode], records_path=str(records_path)) as client:
            for endpoint in ("/v1/completions", "/v1/chat/completions"):
                response = await client.post(endpoint, json={"model": "m", "prompt": "p"})
                assert response.status == 200
            served_records = await (await client.get("/pd/records")).json()
        seen_ids = [r["headers"]["X-Request-Id"] for r in prefill.requests]
        assert [r["request_id"] for r in served_records] == seen_ids
        assert [r["endpoint"] for r in served_records] == ["/v1/completions", "/v1/chat/completions"]
        for record, decode_request in zip(served_records, decode.requests):
            assert RECORD_KEYS <= set(record)
            assert record["prefill_status"] == record["decode_status"] == 200
            assert record["prompt_tokens"] == 512   # the prefill's usage: block-boundary's proof
            assert record["received_kv_transfer_params"]["remote_engine_id"] == "engine-p0"
            assert record["sent_kv_transfer_params"] == record["received_kv_transfer_params"]
            assert record["sent_kv_transfer_params"] == decode_request["json"]["kv_transfer_params"]
            assert record["fault"] is None and record["fault_applied"] is False
            assert record["prefill_ms"] >= 0 and record["decode_ms"] >= 0
            assert dt.datetime.fromisoformat(record["started_at"]).tzinfo is not None
        return served_records

    served_records = asyncio.run(scenario())
    file_records = [json.loads(line) for line in records_path.read_text().splitlines()]
    assert file_records == served_records


def test_fault_drop_transfer_sends_no_kv_params() -> None:
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log)
        async with proxied([prefill], [decode], fault="drop-transfer") as client:
            for _ in range(2):
                response = await client.post("/v1/completions",
                                             json={"model": "m", "prompt": "p", "max_tokens": 4})
                assert response.status == 200
            records = await (await client.get("/pd/records")).json()
        assert len(decode.requests) == 2
        assert all("kv_transfer_params" not in r["json"] for r in decode.requests)
        assert all(r["json"]["max_tokens"] == 4 for r in decode.requests)
        for record in records:
            assert record["fault"] == "drop-transfer" and record["fault_applied"] is True
            assert record["received_kv_transfer_params"] is not None
            assert record["sent_kv_transfer_params"] is None

    asyncio.run(scenario())


def test_fault_foreign_params_sends_the_previous_requests_params() -> None:
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log)
        async with proxied([prefill], [decode], fault="foreign-params") as client:
            for _ in range(3):
                response = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
                assert response.status == 200
            records = await (await client.get("/pd/records")).json()
        sent_block_ids = [r["json"]["kv_transfer_params"]["remote_block_ids"] for r in decode.requests]
        # Request 1 has no predecessor and gets its own; 2 gets 1's; 3 gets 2's.
        assert sent_block_ids == [[1, 101], [1, 101], [2, 102]]
        assert [r["fault_applied"] for r in records] == [False, True, True]
        assert records[1]["sent_kv_transfer_params"] == records[0]["received_kv_transfer_params"]
        assert records[1]["sent_kv_transfer_params"] != records[1]["received_kv_transfer_params"]

    asyncio.run(scenario())


def test_other_fault_names_pass_through_and_are_recorded() -> None:
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log)
        async with proxied([prefill], [decode], fault="corrupt-blocks") as client:
            response = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
            assert response.status == 200
            records = await (await client.get("/pd/records")).json()
        assert decode.requests[0]["json"]["kv_transfer_params"]["remote_block_ids"] == [1, 101]
        assert records[0]["fault"] == "corrupt-blocks" and records[0]["fault_applied"] is False

    asyncio.run(scenario())


def test_invalid_json_body_is_rejected_before_any_hop() -> None:
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log)
        async with proxied([prefill], [decode]) as client:
            response = await client.post("/v1/completions", data=b"{not json",
                                         headers={"Content-Type": "application/json"})
            assert response.status == 400
        assert hop_log == []

    asyncio.run(scenario())


def test_models_passes_through_to_decode() -> None:
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log)
        async with proxied([prefill], [decode], forward_authorization=True) as client:
            response = await client.get("/v1/models", headers={"Authorization": "Bearer k"})
            assert response.status == 200
            assert await response.json() == {"object": "list", "data": [{"id": "model-of-d0"}]}
        assert prefill.requests == []
        assert decode.requests[0]["path"] == "/v1/models"
        assert decode.requests[0]["headers"]["Authorization"] == "Bearer k"

    asyncio.run(scenario())


def test_authorization_is_stripped_unless_the_proxy_forwards_it() -> None:
    """A client's token (lm-eval's $OPENAI_API_KEY fallback, say) never reaches the servers of a
    proxy not started with --forward-authorization."""
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log)
        async with proxied([prefill], [decode]) as client:
            response = await client.post("/v1/completions", json={"model": "m", "prompt": "x"},
                                         headers={"Authorization": "Bearer sk-users-own"})
            assert response.status == 200
            await client.get("/v1/models", headers={"Authorization": "Bearer sk-users-own"})
        seen = prefill.requests + decode.requests
        assert len(seen) == 3
        assert all("Authorization" not in r["headers"] for r in seen)

    asyncio.run(scenario())


def test_cli_runs_the_proxy_as_a_subprocess() -> None:
    port = port_for.select_random()
    command = [sys.executable, "-m", "harness.serve.proxy.app", "--port", str(port),
               "--prefill", "http://127.0.0.1:8100", "--prefill", "http://127.0.0.1:8101",
               "--decode", "http://127.0.0.1:8200", "--fault", "drop-transfer"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 30
        health: dict[str, Any] | None = None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthcheck", timeout=2) as r:
                    health = json.loads(r.read())
                    break
            except OSError:
                time.sleep(0.1)
        assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
        assert health == {"status": "ok",
                          "prefill": ["http://127.0.0.1:8100", "http://127.0.0.1:8101"],
                          "decode": ["http://127.0.0.1:8200"]}
    finally:
        process.terminate()
        try:
            output = process.communicate(timeout=15)[0].decode()
        except subprocess.TimeoutExpired:
            process.kill()
            output = process.communicate()[0].decode()
    assert process.returncode is not None
    assert f"pd proxy on http://127.0.0.1:{port}" in output


def test_a_connection_closed_by_the_server_is_retried_once_on_a_new_one() -> None:
    """uvicorn closes idle keep-alive connections; a request sent on one at that moment must not
    become a 502 (it failed a CPU calibration run before the fix)."""

    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log)
        drops = {"prefill": 1, "decode": 1}
        for fake in (prefill, decode):
            handler = fake._completion

            async def dropping(request: web.Request, handler=handler, role=fake.role):
                if drops[role]:
                    drops[role] -= 1
                    request.transport.close()      # what a closed keep-alive looks like
                    return web.Response()
                return await handler(request)

            fake._completion = dropping
        async with proxied([prefill], [decode]) as client:
            response = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
            assert response.status == 200
            body = await response.json()
            records = await (await client.get("/pd/records")).json()
        assert body["choices"][0]["text"] == "decoded by d0"
        assert records[0]["reconnects"] == ["prefill", "decode"]
        assert drops == {"prefill": 0, "decode": 0}

    asyncio.run(scenario())


def test_a_share_of_the_questions_carries_the_fault_tag():
    """PD_ACCURACY_FAULT_SHARE: the tag on a fixed share of the prompts (hash, so the same
    questions every run), "" on the others; without a share every request carries it."""
    from harness.protocol.faults import parse_request_fault, request_tag_for
    from harness.serve.proxy.hops import tag_for

    tag = request_tag_for("corrupt-block", (("PD_ACCURACY_FAULT_BLOCK", "2"),
                                            ("PD_ACCURACY_FAULT_SHARE", "0.15")))
    assert tag == "fault.corrupt-block.2.zero.@0.15"
    tagged = [tag_for(tag, {"prompt": f"question {i}"}) for i in range(2000)]
    assert 0.12 < sum(map(bool, tagged)) / len(tagged) < 0.18
    assert tagged == [tag_for(tag, {"prompt": f"question {i}"}) for i in range(2000)]
    spec = parse_request_fault("cmpl-pdacc-" + next(t for t in tagged if t) + "ab12-0")
    assert (spec.kind, spec.block, spec.value) == ("corrupt-block", 2, "zero")
    whole = request_tag_for("corrupt-block")
    assert tag_for(whole, {"prompt": "x"}) == whole == "fault.corrupt-block.first.zero."
    assert request_tag_for(None) == request_tag_for("drop-transfer") == ""


def test_push_connector_sends_decode_the_prefills_coordinates_without_its_blocks() -> None:
    """NixlPushConnector (toy_push_proxy_server.py): the decode allocates and registers its own
    blocks, so it gets the prefill's engine, request id and side channel, never its block ids."""
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log)
        async with proxied([prefill], [decode], kv_connector="nixl-push") as client:
            response = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
            assert response.status == 200
            records = await (await client.get("/pd/records")).json()
        assert hop_log == [("prefill", "p0"), ("decode", "d0")]
        assert prefill.requests[0]["json"]["kv_transfer_params"] == EXPECTED_PREFILL_KV_PARAMS
        assert decode.requests[0]["json"]["kv_transfer_params"] == {
            "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "engine-p0",
            "remote_request_id": None, "remote_host": "127.0.0.1", "remote_port": 5600,
            "tp_size": 1}
        [record] = records
        assert record["kv_connector"] == "nixl-push" and record["fault_applied"] is False
        assert record["received_kv_transfer_params"]["remote_block_ids"] == [1, 101]
        assert "remote_block_ids" not in record["sent_kv_transfer_params"]

    asyncio.run(scenario())


def test_push_foreign_params_names_the_previous_requests_prefill() -> None:
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill, decode = FakeUpstream("prefill", "p0", hop_log), FakeUpstream("decode", "d0", hop_log)
        other = FakeUpstream("prefill", "p1", hop_log)
        async with proxied([prefill, other], [decode], kv_connector="nixl-push",
                           fault="foreign-params") as client:
            for _ in range(2):
                response = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
                assert response.status == 200
            records = await (await client.get("/pd/records")).json()
        engines = [r["json"]["kv_transfer_params"]["remote_engine_id"] for r in decode.requests]
        assert engines == ["engine-p0", "engine-p0"]   # the second request's prefill was p1
        assert [r["fault_applied"] for r in records] == [False, True]

    asyncio.run(scenario())


class SilentPrefill(FakeUpstream):
    """A prefill that keeps the KV but answers no kv_transfer_params (Mooncake's)."""

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({"path": request.path, "headers": request.headers.copy(), "json": body})
        self.hop_log.append((self.role, self.name))
        return web.json_response({"id": "cmpl-prefill", "choices": [{"index": 0, "text": "x"}]})


def test_mooncake_transfer_is_named_by_the_proxy_from_the_prefills_side_channel() -> None:
    async def scenario() -> None:
        hop_log: list[tuple[str, str]] = []
        prefill, decode = SilentPrefill("prefill", "p0", hop_log), FakeUpstream("decode", "d0", hop_log)
        for fake in (prefill, decode):
            fake.server = TestServer(fake.app())
            await fake.server.start_server()
        try:
            app = create_app([prefill.url], [decode.url], kv_connector="mooncake",
                             prefill_sides={prefill.url + "/": "127.0.0.1:5600"})
            async with TestClient(TestServer(app)) as client:
                response = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
                assert response.status == 200
                records = await (await client.get("/pd/records")).json()
        finally:
            for fake in (prefill, decode):
                await fake.server.close()
        [record] = records
        sent_prefill = prefill.requests[0]["json"]["kv_transfer_params"]
        assert sent_prefill == {"do_remote_decode": True, "do_remote_prefill": False,
                                "transfer_id": f"xfer-{record['request_id']}"}
        assert record["received_kv_transfer_params"] is None
        assert decode.requests[0]["json"]["kv_transfer_params"] == {
            "do_remote_prefill": True, "do_remote_decode": False,
            "transfer_id": sent_prefill["transfer_id"], "remote_engine_id": "pdacc-mooncake-5600",
            "remote_bootstrap_addr": "http://127.0.0.1:5600"}
        assert record["kv_transfer_handle"]["transfer_id"] == sent_prefill["transfer_id"]

    asyncio.run(scenario())
