"""The soak's verdict: every request's digest, windows of agreement with the baseline's answers,
a one-sided Mann-Kendall trend test, and the line a PASS and a FAIL say."""
from __future__ import annotations

from dataclasses import replace

from harness.core.outcomes import FAIL, PASS
from harness.judge.canaries import canary_outcome
from harness.judge.verdict import CHECKS, decide
from harness.judge.weather import (DIFFERS, IDENTICAL, RequestRow, WeatherCondition,
                                   WeatherJudgement, series_summary, series_trend, series_windows,
                                   weather_checks)
from harness.weathers.soak.driver import SoakDriver
from tests.judge.test_verdict import comparison

HAPPENED = WeatherCondition("happened", "blocks-recycled", True, "40x")


def soak_row(i: int, agrees: bool = True, digest: str = IDENTICAL, status: int = 200) -> RequestRow:
    return RequestRow(f"s{i}", i % 7, "h", status, None if status == 200 else "HTTP 500",
                      digest, answer="4", series_index=i, agrees=agrees)


def judgement(rows, window=100) -> WeatherJudgement:
    # the soak's driver names its requests (harness.weathers.soak.driver.SoakDriver.noun)
    return WeatherJudgement("soak", {}, tuple(rows), (), (HAPPENED,), 0, (), series_window=window,
                            series_noun=SoakDriver.noun)


def checks(j):
    return {name: (passed, detail) for name, passed, detail in weather_checks(j)}


def test_a_clean_soak_passes_and_says_none_of_n_differ():
    j = judgement([soak_row(i) for i in range(1000)])
    got = checks(j)
    assert all(passed for passed, _ in got.values()), got
    assert "no trend can be told" in got["agreement-trend"][1]
    verdict = decide(comparison(), weather=j)
    assert verdict.status == PASS, verdict.reason
    assert "soak: 0 of 1000 soak requests differ over 10 windows of 100" in verdict.reason
    summary = series_summary(j)
    assert summary["requests"] == 1000 and len(summary["windows"]) == 10
    assert summary["windows"][3]["agreement"] == 1.0


def test_a_fault_after_the_400th_request_fails_naming_where_it_began():
    look = [RequestRow(f"q{d}", d, "h", 200, None, IDENTICAL) for d in range(128)]
    rows = look + [soak_row(i, digest=IDENTICAL if i < 272 else DIFFERS) for i in range(800)]
    passed, detail = checks(judgement(rows))["silent-wrong-answers"]
    assert not passed
    assert ("528 of 800 soak requests differ over 8 windows of 100, the first at soak request "
            "272 (window 2; the cell's request no. 401, after its first look's 128), none "
            "before") in detail
    verdict = decide(comparison(), weather=judgement(rows))
    assert verdict.status == FAIL
    assert canary_outcome("corrupt-block", verdict.status, verdict.reason) == "CAUGHT"


def test_agreement_that_falls_window_by_window_is_a_trend_beyond_chance():
    # 100 % agreement in the first windows, 46 % by the last (SGLang #23020's shape)
    rows = [soak_row(i, agrees=(i % 100) >= (i // 100) * 6) for i in range(1000)]
    windows = series_windows(tuple(rows), 100)
    assert [w.agree for w in windows][:3] == [100, 94, 88]
    tau, p = series_trend(windows)
    assert tau is not None and tau < -0.9 and p < 0.01
    passed, detail = checks(judgement(rows))["agreement-trend"]
    assert not passed and "Mann-Kendall tau -1.000" in detail
    verdict = decide(comparison(), weather=judgement(rows))
    assert verdict.status == FAIL and verdict.reason.startswith("agreement falls over the series")


def test_scattered_disagreement_is_not_a_trend():
    rows = [soak_row(i, agrees=i % 50 != 7) for i in range(1000)]
    tau, p = series_trend(series_windows(tuple(rows), 100))
    assert p >= 0.01
    assert checks(judgement(rows))["agreement-trend"][0]


def test_a_failed_soak_request_is_unaccounted_and_counted_in_its_window():
    rows = [soak_row(i) for i in range(300)]
    rows[150] = soak_row(150, status=500)
    got = checks(judgement(rows))
    assert not got["failures-accounted"][0]
    assert series_windows(tuple(rows), 100)[1].failed == 1


def test_calm_and_other_weathers_have_no_soak_check():
    j = replace(judgement([soak_row(1)]), series_window=0)
    assert "agreement-trend" not in checks(j)
    assert "soak" not in j.to_dict()
    assert [row.name for row in CHECKS].index("agreement-trend") > [row.name for row in CHECKS].index(
        "servers-healthy")


def test_children_of_n_above_one_are_called_children_in_one_window():
    j = replace(judgement([soak_row(i) for i in range(100)], window=100),
                weather="parallel-sampling", series_noun=("child", "children"))
    line = series_summary(j)["line"]
    assert line.startswith("0 of 100 children differ (KV digest per request)"), line
    assert "soak" not in line and "windows" not in line
