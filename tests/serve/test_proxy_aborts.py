"""The aborts weather in the proxy: which requests it cancels, at which hop, and what the
client and the record say (fake prefill/decode servers; the real ones: docs/weather-faults.md)."""
from __future__ import annotations

import asyncio

import pytest

from harness.weathers.aborts import protocol as aborts
from harness.serve.proxy.hops import new_request_id
from tests.serve.test_proxy import FakeUpstream, pair, proxied

CHUNKS = [b'data: {"choices":[{"text":"A"}]}\n\n', b'data: {"choices":[{"text":"B"}]}\n\n',
          b"data: [DONE]\n\n"]


def test_tag_names_a_phase_and_untagged_ids_are_left_alone():
    for phase in aborts.PHASES:
        assert aborts.abort_phase(f"cmpl-{new_request_id(aborts.request_tag(phase))}-0") == phase
    assert aborts.abort_phase(new_request_id()) is None
    assert aborts.abort_phase(new_request_id("fault.corrupt-block.first.zero.")) is None


def test_an_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="abort phase"):
        aborts.request_tag("later")


def test_mix_deals_every_phase_in_turn():
    dealt = [aborts.abort_phase(new_request_id(aborts.request_tag(aborts.MIX)), turn)
             for turn in range(8)]
    assert dealt == list(aborts.PHASES) * 2


def test_the_proxy_deals_mixed_phases_to_tagged_requests_only():
    async def scenario():
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log, sse_chunks=CHUNKS)
        async with proxied([prefill], [decode],
                           request_tag=aborts.request_tag(aborts.MIX) + "@0.5") as client:
            for i in range(24):
                await client.post("/v1/completions",
                                  json={"model": "m", "prompt": f"q{i}", "max_tokens": 4})
            return await (await client.get("/pd/records")).json()

    records = asyncio.run(scenario())
    phases = [r.get("abort_phase") for r in records if "wx.abort." in r["request_id"]]
    assert phases and phases == [aborts.PHASES[i % 4] for i in range(len(phases))]
    assert all("abort_phase" not in r for r in records if "wx.abort." not in r["request_id"])


def run_one(phase: str, **decode_kwargs):
    async def scenario():
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log, **decode_kwargs)
        async with proxied([prefill], [decode],
                           request_tag=aborts.request_tag(phase)) as client:
            response = await client.post("/v1/completions",
                                         json={"model": "m", "prompt": "p", "max_tokens": 4})
            body = await response.json()
            records = await (await client.get("/pd/records")).json()
        return response.status, body, records[0], prefill, decode

    return asyncio.run(scenario())


@pytest.mark.parametrize("phase, prefill_calls, decode_calls", [
    ("queued", 1, 0), ("prefilled", 1, 0), ("reading", 1, 1), ("decoding", 1, 1)])
def test_each_phase_stops_at_its_hop_and_answers_loudly(phase, prefill_calls, decode_calls):
    status, body, record, prefill, decode = run_one(phase, sse_chunks=CHUNKS)
    assert status == aborts.ABORT_STATUS
    assert body["error"]["abort_phase"] == phase and phase in body["error"]["message"]
    assert record["abort_phase"] == phase and phase in record["error"]
    assert (len(prefill.requests), len(decode.requests)) == (prefill_calls, decode_calls)
    if phase == "queued":
        assert prefill.requests[0]["json"]["stream"] is True     # dropped once vLLM took it
    if decode_calls:
        assert decode.requests[0]["json"]["stream"] is True
        assert "kv_transfer_params" in decode.requests[0]["json"]
    assert record.get("abort_tokens_seen", False) is (phase == "decoding")


def test_an_upstream_error_before_the_abort_point_is_passed_through():
    async def scenario():
        hop_log: list[tuple[str, str]] = []
        prefill = FakeUpstream("prefill", "p0", hop_log, error_status=503, error_body=b"{}")
        decode = FakeUpstream("decode", "d0", hop_log)
        async with proxied([prefill], [decode],
                           request_tag=aborts.request_tag("reading")) as client:
            response = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
            return response.status, decode

    status, decode = asyncio.run(scenario())
    assert status == 503 and not decode.requests


def test_hold_makes_new_requests_wait_until_release():
    async def scenario():
        hop_log: list[tuple[str, str]] = []
        prefill, decode = pair(hop_log)
        async with proxied([prefill], [decode]) as client:
            assert (await (await client.post("/pd/hold")).json()) == {"admitting": False}
            waiting = asyncio.ensure_future(client.post(
                "/v1/completions", json={"model": "m", "prompt": "p", "max_tokens": 4}))
            await asyncio.sleep(0.3)
            assert not waiting.done() and not prefill.requests
            assert (await (await client.post("/pd/release")).json()) == {"admitting": True}
            response = await asyncio.wait_for(waiting, timeout=5)
            return response.status, len(prefill.requests)

    assert asyncio.run(scenario()) == (200, 1)
