"""The verdict under weather: silent wrong answers, failures accounted to injected events, the
weather's own conditions, servers' health; named per request, in CHECKS order."""
from __future__ import annotations

from dataclasses import replace

from harness.core.outcomes import ERROR, FAIL
from harness.judge.verdict import CHECKS, decide
from tests.judge.test_verdict import comparison
from harness.judge.weather import (DIFFERS, IDENTICAL, MISSING, InjectedEvent, RequestRow,
                                   WeatherCondition, WeatherJudgement, summary, weather_checks)

OK = RequestRow("r1", 1, "h1", 200, None, IDENTICAL, answer="4", correct=True)
HAPPENED = WeatherCondition("happened", "blocks-recycled", True, "9.0x")


def judgement(*rows, events=(), conditions=(HAPPENED,), budget=0, unhealthy=()):
    return WeatherJudgement("load", {}, tuple(rows), tuple(events), tuple(conditions), budget,
                            tuple(unhealthy))


def checks(j):
    return {name: (passed, detail) for name, passed, detail in weather_checks(j)}


def test_a_calm_looking_run_passes_every_weather_check():
    got = checks(judgement(OK, replace(OK, request_id="r2", doc_id=2)))
    assert all(passed for passed, _ in got.values()), got
    assert "silent wrong answers: 0 (2/2" in got["silent-wrong-answers"][1]


def test_a_200_whose_kv_differs_is_a_silent_wrong_answer_named():
    wrong = replace(OK, request_id="r17", doc_id=17, digest=DIFFERS,
                    digest_detail="first at layers.0 k head 1, decode block 2",
                    events=("read-delayed",))
    passed, detail = checks(judgement(OK, wrong))["silent-wrong-answers"]
    assert not passed
    assert ("request r17 (doc 17) answered 200 after read-delayed; its KV differs from its "
            "prefill's (first at layers.0 k head 1, decode block 2)") in detail
    unproven = replace(OK, digest=MISSING, digest_detail="no prefill digest")
    assert not checks(judgement(unproven))["silent-wrong-answers"][0]


def test_failures_must_be_loud_accounted_and_within_the_budget():
    failed = replace(OK, request_id="r3", status=500, error="HTTP 500 err", digest=MISSING)
    passed, detail = checks(judgement(OK, failed))["failures-accounted"]
    assert not passed and "request r3 (doc 1) failed (HTTP 500 err)" in detail
    event = InjectedEvent("abort", "r3")
    accounted = replace(failed, events=("abort",))
    assert checks(judgement(OK, accounted, events=[event], budget=1))["failures-accounted"][0]
    over = checks(judgement(accounted, replace(accounted, request_id="r4"), events=[event],
                            budget=1))["failures-accounted"]
    assert not over[0] and "more than the weather's budget of 1" in over[1]
    # a failed request is not a silent wrong answer
    assert checks(judgement(accounted, events=[event], budget=1))["silent-wrong-answers"][0]


def test_conditions_and_health():
    not_blown = WeatherCondition("happened", "blocks-recycled", False, "0.2x")
    got = checks(judgement(OK, conditions=[not_blown],
                           unhealthy=["decode-0: died"]))
    assert not got["weather-happened"][0] and "blocks-recycled: 0.2x" in got["weather-happened"][1]
    assert not got["servers-healthy"][0] and "decode-0: died" in got["servers-healthy"][1]
    holds = WeatherCondition("holds", "expired-count", False, "2 expired, 3 injected")
    assert not checks(judgement(OK, conditions=[HAPPENED, holds]))["weather-holds"][0]


def test_summary_counts():
    failed = replace(OK, request_id="r3", status=500, error="x", events=("abort",))
    s = summary(judgement(OK, failed, events=[InjectedEvent("abort", "r3")], budget=1))
    assert s == {"requests": 2, "answered": 1, "failed": 1, "answered_kv_identical": 1,
                 "silent_wrong": 0, "events": 1, "failed_with_event": 1}


def test_weather_checks_come_before_the_transfer_proof_in_the_table():
    names = [row.name for row in CHECKS]
    assert names.index("baseline-health") < names.index("weather-happened") < \
        names.index("silent-wrong-answers") < names.index("proxy-saw-every-question")
    assert {row.name: row.status for row in CHECKS}["weather-happened"] == ERROR


def test_decide_under_weather():
    clean_comparison = comparison()
    wrong = replace(OK, digest=DIFFERS, digest_detail="block 0")
    v = decide(clean_comparison, weather=judgement(OK, wrong))
    assert v.status == FAIL and v.reason.startswith("silent wrong answers under weather: 1 of 2")
    assert "weather" in v.decision_path
    v = decide(clean_comparison, weather=judgement(OK, conditions=[
        WeatherCondition("happened", "in-flight", False, "at most 3")]))
    assert v.status == ERROR and "the weather did not happen" in v.reason
    v = decide(clean_comparison, weather=replace(judgement(OK), accounted_checks={
        "no-failed-transfers": "reads fail on purpose"}))
    assert any("no-failed-transfers: accounted per request" in n for n in v.not_available)
    assert v.status != FAIL
