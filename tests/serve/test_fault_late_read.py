"""The late-read weather fault (expiry): which requests it holds, for how long, and that a held
request's connector answers "cannot tell yet" and gets no lease-renewal heartbeats."""
from __future__ import annotations

import types

import pytest

from harness.weathers.expiry.protocol import parse_delay_ms, parse_late_read_log, request_tag
from harness.weathers.expiry import in_server as late_read
from harness.serve.proxy.hops import new_request_id, tag_for


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def engine_id(proxy_id: str) -> str:
    return f"cmpl-{proxy_id}-0-89a1672b"


def test_tag_round_trips_through_a_proxy_id_and_vllm_id():
    tagged = engine_id(new_request_id(request_tag(4000)))
    assert parse_delay_ms(tagged) == 4000
    assert parse_delay_ms(engine_id(new_request_id())) is None


@pytest.mark.parametrize("delay", [0, -5])
def test_a_delay_must_be_positive(delay):
    with pytest.raises(ValueError, match="positive"):
        request_tag(delay)


def test_share_tags_some_prompts_only():
    tag = request_tag(3000) + "@0.3"
    tagged = [tag_for(tag, {"prompt": f"question {i}"}) for i in range(200)]
    share = sum(bool(t) for t in tagged) / len(tagged)
    assert 0.15 < share < 0.45
    assert all(t in ("", request_tag(3000)) for t in tagged)


def test_hold_keeps_a_tagged_request_until_its_delay_then_forgets_it():
    clock = Clock()
    hold = late_read.Hold(clock)
    rid = engine_id(new_request_id(request_tag(2000)))
    assert hold.arrive(rid) == 2000
    clock.now += 1.999
    assert hold.waiting(rid)
    clock.now += 0.002
    assert not hold.waiting(rid)
    assert rid not in hold.until


def test_hold_leaves_untagged_requests_alone():
    hold = late_read.Hold(Clock())
    rid = engine_id(new_request_id())
    assert hold.arrive(rid) is None
    assert not hold.waiting(rid)


class FakeScheduler:
    def __init__(self) -> None:
        self.stopped: list[str] = []

    def _stop_heartbeat(self, request_id: str) -> None:
        self.stopped.append(request_id)


def fake_connector_class():
    class NixlPullConnector:   # the name picks the connector module that stops renewals
        def __init__(self) -> None:
            self.connector_scheduler = FakeScheduler()

        def on_new_request(self, request):
            return None

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            return 640 - num_computed_tokens, True

    return NixlPullConnector


def test_patched_connector_answers_none_while_held_and_stops_heartbeats():
    clock = Clock()
    hold = late_read.Hold(clock)
    cls = fake_connector_class()
    late_read.patch_class(cls, hold)
    late_read.patch_class(cls, hold)        # idempotent: one wrapper
    connector = cls()
    held = types.SimpleNamespace(request_id=engine_id(new_request_id(request_tag(500))))
    clean = types.SimpleNamespace(request_id=engine_id(new_request_id()))
    for request in (held, clean):
        connector.on_new_request(request)
    assert connector.connector_scheduler.stopped == [held.request_id]
    assert connector.get_num_new_matched_tokens(held, 0) == (None, False)
    assert connector.get_num_new_matched_tokens(clean, 0) == (640, True)
    clock.now += 0.5
    assert connector.get_num_new_matched_tokens(held, 0) == (640, True)


def test_log_lines_read_back(caplog):
    clock = Clock()
    hold = late_read.Hold(clock)
    rid = engine_id(new_request_id(request_tag(4000)))
    cls = fake_connector_class()
    late_read.patch_class(cls, hold)
    with caplog.at_level("WARNING", logger="vllm.pd_accuracy.late_read"):
        cls().on_new_request(types.SimpleNamespace(request_id=rid))
        clock.now += 4.2
        hold.waiting(rid)
    lines = parse_late_read_log(caplog.text)
    assert [(l.event, l.request_id, l.delay_ms) for l in lines] == [
        ("held", rid, 4000), ("released", rid, 4000)]
    assert lines[0].heartbeat == "stopped" and lines[1].waited_ms == 4200
