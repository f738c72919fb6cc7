"""The verdict under weather: *silent wrong answers: 0*.

A cell judged in a weather other than calm (harness.weathers) is judged per request. Every
request's row joins what the client got (HTTP status, stream error, answer), what the proxy
recorded, and the KV digests of its prefill and decode (harness.run.evidence.kv_digest_evidence),
with the event the weather injected into it, if any (harness.run.weather). Then:

* ``weather-happened``   the weather blew as intended (blocks recycled, preemptions counted,
                         events injected): else nothing is said about P/D under it (ERROR);
* ``silent-wrong-answers`` every HTTP 200 holds, proven by the digest, the prompt KV its own
                         prefill computed; one that does not is a silent wrong answer (FAIL);
* ``failures-accounted`` every failure is loud (a non-200 status or an error in the stream)
                         and accounted to an event the weather injected into that request, and
                         no more requests failed than the weather's budget (FAIL);
* ``weather-holds``      what the weather itself says must hold (an expired count matching the
                         events, a recompute counted per injected failure ...) (FAIL);
* ``servers-healthy``    every P/D server is alive and answers /health afterwards (FAIL);
* ``agreement-trend``    under a weather that sends a request series of its own after the
                         first look (harness.run.weather.base.Sustain, with windows): the
                         share of each window's answers that agree with the baseline's answer
                         to the same question does not fall over the series beyond chance: a one-sided Mann-Kendall test (Kendall's tau of
                         the windows' agreement against their order, scipy) at alpha 0.01 (FAIL);

and the answers of the 200s are non-inferior to the baseline's (the ``accuracy`` check, on the
questions answered). Reasons name the request and the event.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

# A request's digest as the weather check reads it
IDENTICAL, DIFFERS, MISSING, NOT_DIGESTED = "identical", "differs", "missing", "not-digested"


@dataclass(frozen=True)
class InjectedEvent:
    """One thing a weather did to one request (or to a server, `request_id` None)."""

    kind: str                    # e.g. "abort-mid-decode", "read-delayed", "load-failed"
    request_id: str | None       # the proxy's request id (X-Request-Id) it was done to
    detail: str = ""
    may_fail: bool = True        # the request may end in a loud failure because of it
    # the decode computed this prompt's KV itself (a failed read under kv_load_failure_policy
    # recompute): no transfer to digest; its answer must equal the baseline's instead
    recomputed: bool = False


@dataclass(frozen=True)
class RequestRow:
    """One request of a weather cell, as the verdict sees it."""

    request_id: str | None       # the proxy's id (None: the proxy never saw it)
    doc_id: int | None
    prompt_hash: str | None
    status: int | None           # the client's HTTP status (None: no answer at all)
    error: str | None            # the failure as the client saw it (None: answered)
    digest: str                  # IDENTICAL | DIFFERS | MISSING | NOT_DIGESTED
    digest_detail: str = ""      # where the KV first differs, or which side is missing
    answer: str | None = None
    correct: bool | None = None
    baseline_correct: bool | None = None
    events: tuple[str, ...] = ()  # kinds of the events injected into this request
    recomputed: bool = False      # an event says its KV was recomputed, not transferred
    # a series' request: its place in the series (0-based, the order it was sent in) and whether
    # its answer is the baseline's answer to the same question (None: not answered)
    series_index: int | None = None
    agrees: bool | None = None

    @property
    def answered(self) -> bool:
        return self.status == 200 and self.error is None

    def name(self) -> str:
        return (f"request {self.request_id or '?'}"
                + (f" (doc {self.doc_id})" if self.doc_id is not None else ""))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class WeatherCondition:
    """A condition a weather states about its own run: that it happened ("happened"), or what
    must hold under it ("holds")."""

    kind: str                    # "happened" | "holds"
    name: str                    # e.g. "blocks-recycled"
    passed: bool
    detail: str


@dataclass(frozen=True)
class WeatherJudgement:
    """Everything the verdict under weather needs of one weather cell's evaluation."""

    weather: str
    params: dict[str, float]
    rows: tuple[RequestRow, ...]
    events: tuple[InjectedEvent, ...]
    conditions: tuple[WeatherCondition, ...]
    failure_budget: int          # the most requests that may fail loudly
    unhealthy: tuple[str, ...]   # "<server>: <why>" for each P/D server not healthy afterwards
    # transfer checks the weather accounts for per request ("no-failed-transfers": it injects
    # failed reads): name -> why; they are left out of the aggregate transfer proof
    accounted_checks: dict[str, str] = field(default_factory=dict)
    series_window: int = 0       # a series' requests per window (0: the weather sends none)
    series_wall_s: float = 0.0     # how long its requests took
    # what the verdict calls the series' requests (one, many): the weather's Sustain.noun
    series_noun: tuple[str, str] = ("request", "requests")

    def to_dict(self) -> dict[str, Any]:
        series = {"series": series_summary(self)} if self.series_window else {}
        return {"weather": self.weather, "params": self.params, **series,
                "rows": [r.to_dict() for r in self.rows],
                "events": [asdict(e) for e in self.events],
                "conditions": [asdict(c) for c in self.conditions],
                "failure_budget": self.failure_budget, "unhealthy": list(self.unhealthy),
                "accounted_checks": dict(self.accounted_checks),
                "summary": summary(self)}


def summary(j: WeatherJudgement) -> dict[str, int]:
    rows = j.rows
    return {"requests": len(rows), "answered": sum(r.answered for r in rows),
            "failed": sum(not r.answered for r in rows),
            "answered_kv_identical": sum(r.answered and r.digest == IDENTICAL for r in rows),
            "silent_wrong": len(silent_wrong(rows)),
            "events": len(j.events),
            "failed_with_event": sum((not r.answered) and bool(r.events) for r in rows)}


def recomputed_right(row: RequestRow) -> bool:
    """A recomputed request (nothing crossed, no decode digest) whose answer is the baseline's
    (right when the baseline's is unknown)."""
    want = True if row.baseline_correct is None else row.baseline_correct
    return row.recomputed and row.digest == MISSING and row.correct == want


def silent_wrong(rows: tuple[RequestRow, ...]) -> list[RequestRow]:
    """The 200s whose prompt KV is not proven identical to their prefill's (a recomputed one:
    whose answer is not the baseline's)."""
    return [r for r in rows if r.answered and r.digest != IDENTICAL and not recomputed_right(r)]


def _event_text(row: RequestRow) -> str:
    return (f" after {', '.join(row.events)}" if row.events else "")


def _wrong_line(row: RequestRow) -> str:
    if row.recomputed:
        return (f"{row.name()} answered 200{_event_text(row)}; its recomputed answer "
                f"{row.answer!r} is {'right' if row.correct else 'wrong'}, the baseline's "
                f"{'right' if row.baseline_correct else 'wrong'}")
    what = {DIFFERS: "its KV differs from its prefill's",
            MISSING: "its KV is unproven (a digest is missing)",
            NOT_DIGESTED: "its KV is unproven (not digested)"}.get(row.digest, row.digest)
    detail = f" ({row.digest_detail})" if row.digest_detail else ""
    return f"{row.name()} answered 200{_event_text(row)}; {what}{detail}"


TREND_ALPHA = 0.01
TREND_MIN_WINDOWS = 4     # fewer windows than this: no trend can be told from chance


@dataclass(frozen=True)
class SeriesWindow:
    """One window of a series' requests, in the order they were sent."""

    index: int
    first: int                   # the series index of its first request
    requests: int
    answered: int                # HTTP 200s
    agree: int                   # 200s whose answer is the baseline's to the same question
    differs: int                 # 200s whose KV is not proven its prefill's (digest)
    failed: int                  # loud failures

    @property
    def agreement(self) -> float | None:
        return self.agree / self.answered if self.answered else None


def series_rows(rows: tuple[RequestRow, ...]) -> list[RequestRow]:
    return sorted((r for r in rows if r.series_index is not None), key=lambda r: r.series_index)


def series_windows(rows: tuple[RequestRow, ...], window: int) -> list[SeriesWindow]:
    """The series' requests cut into windows of `window` (the last may be shorter)."""
    series = series_rows(rows)
    wrong = {id(r) for r in silent_wrong(tuple(series))}
    out = []
    for w, start in enumerate(range(0, len(series), window)):
        part = series[start:start + window]
        out.append(SeriesWindow(w, part[0].series_index or 0, len(part),
                              sum(r.answered for r in part),
                              sum(bool(r.answered and r.agrees) for r in part),
                              sum(id(r) in wrong for r in part),
                              sum(not r.answered for r in part)))
    return out


def series_trend(windows: list[SeriesWindow]) -> tuple[float | None, float]:
    """(Kendall's tau, one-sided p) of the windows' agreement against their order: the
    Mann-Kendall test for a downward trend. Constant agreement (tau undefined) and too few
    windows give (None, 1.0): no evidence of a trend."""
    from scipy.stats import kendalltau

    points = [(w.index, w.agreement) for w in windows if w.agreement is not None]
    if len(points) < TREND_MIN_WINDOWS or len({a for _, a in points}) < 2:
        return None, 1.0
    result = kendalltau([i for i, _ in points], [a for _, a in points], alternative="less")
    tau, p = float(result.statistic), float(result.pvalue)
    return (None, 1.0) if math.isnan(tau) or math.isnan(p) else (tau, p)


def series_summary(j: WeatherJudgement) -> dict[str, Any]:
    windows = series_windows(j.rows, j.series_window)
    tau, p = series_trend(windows)
    return {"requests": sum(w.requests for w in windows), "window": j.series_window,
            "windows": [{**asdict(w), "agreement": w.agreement} for w in windows],
            "differs": sum(w.differs for w in windows), "failed": sum(w.failed for w in windows),
            "agree": sum(w.agree for w in windows), "answered": sum(w.answered for w in windows),
            "trend_tau": tau, "trend_p": p, "trend_alpha": TREND_ALPHA,
            "wall_s": j.series_wall_s,
            "line": series_line(j)}


def series_line(j: WeatherJudgement) -> str:
    """"D of N requests differ over W windows" and what else the series saw, in one line."""
    series = series_rows(j.rows)
    windows = series_windows(j.rows, j.series_window)
    wrong = silent_wrong(tuple(series))
    answered = sum(r.answered for r in series)
    agree = sum(bool(r.answered and r.agrees) for r in series)
    look = sum(r.series_index is None and r.doc_id is not None for r in j.rows)
    first = "" if not wrong else (
        f", the first at {j.series_noun[0]} {wrong[0].series_index} (window "
        f"{wrong[0].series_index // j.series_window}; the cell's request no. "
        f"{wrong[0].series_index + look + 1}, after its first look's {look}), none before")
    over = f" over {len(windows)} windows of {j.series_window}" if len(windows) > 1 else ""
    return (f"{len(wrong)} of {len(series)} {j.series_noun[1]} differ{over}"
            f"{first} (KV digest per request); {agree} of {answered} answers "
            f"agree with the baseline's to the same question; "
            f"{sum(not r.answered for r in series)} failed")


def _trend_check(j: WeatherJudgement) -> tuple[str, bool, str]:
    windows = series_windows(j.rows, j.series_window)
    tau, p = series_trend(windows)
    series = ", ".join("-" if w.agreement is None else f"{w.agreement:.2f}" for w in windows)
    told = ("no trend can be told" if tau is None else
            f"Mann-Kendall tau {tau:+.3f}, one-sided p {p:.2g}")
    return ("agreement-trend", p >= TREND_ALPHA,
            f"agreement per window of {j.series_window}: [{series}]; {told} "
            f"(alpha {TREND_ALPHA:g})")


def weather_checks(j: WeatherJudgement) -> list[tuple[str, bool, str]]:
    """(name, passed, detail) of each weather check, in CHECKS order (harness.judge.verdict)."""
    happened = [c for c in j.conditions if c.kind == "happened"]
    holds = [c for c in j.conditions if c.kind != "happened"]
    checks: list[tuple[str, bool, str]] = []
    bad = [c for c in happened if not c.passed]
    checks.append(("weather-happened", not bad,
                   "; ".join(f"{c.name}: {c.detail}" for c in (bad or happened))
                   or f"weather {j.weather} states no condition"))
    wrong = silent_wrong(j.rows)
    s = summary(j)
    series = f"{j.weather}: {series_line(j)}; " if j.series_window and wrong else ""
    checks.append(("silent-wrong-answers", not wrong,
                   series + f"{len(wrong)} of {s['answered']} HTTP 200s: " + "; ".join(
                       _wrong_line(r) for r in wrong[:3]) if wrong else
                   f"silent wrong answers: 0 ({s['answered_kv_identical']}/{s['answered']} "
                   f"HTTP 200s with the prefill's prompt KV, byte for byte)"))
    failed = [r for r in j.rows if not r.answered]
    unaccounted = [r for r in failed if not r.events]
    over = len(failed) > j.failure_budget
    if unaccounted:
        detail = (f"{len(unaccounted)} of {len(failed)} failures with no injected event: "
                  + "; ".join(f"{r.name()} failed ({r.error or r.status})" for r in unaccounted[:3]))
    elif over:
        detail = (f"{len(failed)} requests failed, more than the weather's budget of "
                  f"{j.failure_budget} ({len(j.events)} events injected)")
    else:
        detail = (f"{len(failed)} failures, each loud and after an injected event "
                  f"(budget {j.failure_budget}; {len(j.events)} events)")
    checks.append(("failures-accounted", not unaccounted and not over, detail))
    bad = [c for c in holds if not c.passed]
    checks.append(("weather-holds", not bad,
                   "; ".join(f"{c.name}: {c.detail}" for c in (bad or holds))
                   or f"weather {j.weather} states nothing more"))
    checks.append(("servers-healthy", not j.unhealthy,
                   "; ".join(j.unhealthy) if j.unhealthy else "every P/D server answers /health"))
    if j.series_window:
        checks.append(_trend_check(j))
    return checks


__all__ = ["DIFFERS", "IDENTICAL", "MISSING", "NOT_DIGESTED", "TREND_ALPHA", "InjectedEvent",
           "RequestRow", "SeriesWindow", "WeatherCondition", "WeatherJudgement", "silent_wrong",
           "series_line", "series_summary", "series_trend", "series_windows", "summary", "weather_checks"]
