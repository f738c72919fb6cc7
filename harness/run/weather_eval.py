"""A cell under weather on its running pair: the weather's workload, and after each look the
per-request judgement (harness.judge.weather) built from what the look left: the client's
answers and failures, the proxy's records, both sides' KV digests, the weather's events and
conditions, each P/D server's /metrics before and after and its health.
"""
from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

from harness.core import exact_headers
from harness.core.cell import Cell
from harness.weathers import resolved_params
from harness.eval.lmeval import EvalRun, QuestionRecord
from harness.eval.metrics import scrape_samples
from harness.judge.sequential import SequentialPlan
from harness.judge.weather import (MISSING, NOT_DIGESTED, InjectedEvent, RequestRow,
                                   WeatherJudgement)
from harness.run.evidence.kv_digest_evidence import parent_id, request_digests
from harness.run.evidence.transfer_evidence import DigestFiles, read_proxy_records
from harness.run.weather import weather_for
from harness.run.weather.base import SeriesQuestion, Weather, WeatherRun, Workload
from harness.serve.deploy import Deployment

_STATUS = re.compile(r"HTTP (\d{3})")
HEALTH_TIMEOUT_S = 10.0
DISTURBANCE_TIMEOUT_S = 900.0   # two server restarts on a loaded 2-core host


def weather_plan(plan: SequentialPlan, min_questions: int | None) -> SequentialPlan:
    """`plan` whose first look asks at least `min_questions` (a load needs enough requests)."""
    if not min_questions or plan.stages[0] >= min_questions:
        return plan
    later = tuple(s for s in plan.stages if s > min_questions)
    return dataclasses.replace(plan, stages=(min_questions,) + later)


def answered_only(run: EvalRun, doc_ids: set[int]) -> EvalRun:
    """`run` restricted to `doc_ids` (the questions the P/D pair answered under weather)."""
    return run.first(doc_ids=doc_ids)


def client_status(q: QuestionRecord) -> int | None:
    """The HTTP status the client saw for `q` (200 with a finish_reason "error" in the body)."""
    if q.error is None:
        return 200
    match = _STATUS.search(q.error)
    return int(match.group(1)) if match else (200 if "finish_reason" in q.error else None)


def samples_of(pair: Deployment) -> dict[str, dict[str, float]]:
    """Each P/D server's /metrics samples now ({} for one that does not answer)."""
    out: dict[str, dict[str, float]] = {}
    for spec in pair.specs:
        try:
            out[spec.name] = scrape_samples(spec.base_url)
        except Exception:  # noqa: BLE001 - a dead server: servers-healthy says so
            out[spec.name] = {}
    return out


def unhealthy(pair: Deployment) -> tuple[str, ...]:
    """"<server>: <why>" for each P/D server not alive or not answering /health."""
    problems = []
    for spec in pair.specs:
        proc = pair.processes.get(spec.name)
        if proc is not None and not proc.is_running():
            problems.append(f"{spec.name}: died")
            continue
        try:
            status = exact_headers.get(f"{spec.base_url}/health", timeout=HEALTH_TIMEOUT_S).status_code
        except Exception as exc:  # noqa: BLE001 - any failure to answer is the finding
            problems.append(f"{spec.name}: /health did not answer ({type(exc).__name__})")
            continue
        if status != 200:
            problems.append(f"{spec.name}: /health {status}")
    return tuple(problems)


def request_rows(pd_run: EvalRun, base_run: EvalRun, records: list[dict],
                 digests: dict[str, tuple[str, str]]) -> tuple[RequestRow, ...]:
    """One row per question asked (joined to its proxy record by the prompt's hash), then one
    per proxy record no question claims (a request the client gave up on)."""
    by_prompt = {r.get("prompt_hash"): r for r in records if r.get("prompt_hash")}
    baseline = base_run.by_doc()
    rows, claimed = [], set()
    for q in pd_run.questions:
        record = by_prompt.get(q.prompt_hash) or {}
        rid = record.get("request_id")
        claimed.add(rid)
        digest, detail = digests.get(str(rid), (MISSING, "the proxy saw no request"))
        base = baseline.get(q.doc_id)
        rows.append(RequestRow(
            request_id=rid, doc_id=q.doc_id, prompt_hash=q.prompt_hash, status=client_status(q),
            error=q.error or record.get("error"), digest=digest, digest_detail=detail,
            answer=q.answer_strict if q.error is None else None,
            correct=q.correct if q.error is None else None,
            baseline_correct=None if base is None else base.correct))
    for record in records:
        if record.get("request_id") not in claimed:
            digest, detail = digests.get(str(record.get("request_id")), (MISSING, ""))
            rows.append(RequestRow(
                request_id=record.get("request_id"), doc_id=None,
                prompt_hash=record.get("prompt_hash"), status=record.get("decode_status"),
                error=record.get("error") or "no answer reached the client",
                digest=digest, digest_detail=detail))
    return tuple(rows)


def with_events(rows: tuple[RequestRow, ...], events: tuple[InjectedEvent, ...]
                ) -> tuple[RequestRow, ...]:
    by_request: dict[str, list[str]] = {}
    recomputed: set[str] = set()
    for event in events:
        if event.request_id:
            by_request.setdefault(event.request_id, []).append(event.kind)
            if event.recomputed:
                recomputed.add(event.request_id)
    return tuple(dataclasses.replace(r, events=tuple(by_request.get(str(r.request_id), ())),
                                     recomputed=str(r.request_id) in recomputed)
                 for r in rows)


def series_questions(pd_run: EvalRun, base_run: EvalRun) -> list[SeriesQuestion]:
    """The questions a series asks again: every question of the look whose request lm-eval sent
    is known (one that failed there too: a fault by prompt hash must meet it again), each with
    the baseline's answer (the baseline is not asked again)."""
    baseline = base_run.by_doc()
    return [SeriesQuestion(q.doc_id, pd_run.payloads[q.prompt_hash],
                         baseline[q.doc_id].answer_strict)
            for q in pd_run.questions if q.prompt_hash in pd_run.payloads and q.doc_id in baseline]


def with_digests(series: tuple[RequestRow, ...], digests: dict[str, tuple[str, str]],
                 records: list[dict]) -> tuple[RequestRow, ...]:
    """The series' rows with each request's digest and prompt hash (from the proxy's record)."""
    hashes = {str(r.get("request_id")): r.get("prompt_hash") for r in records}

    def digest(row: RequestRow) -> tuple[str, str]:
        seen = parent_id(row.request_id) in hashes
        why = ("no decode digest of this child: it did not read its prefill's KV"
               if seen and parent_id(row.request_id) != str(row.request_id)
               else "the proxy saw no request")
        return digests.get(str(row.request_id), (MISSING, why))

    return tuple(dataclasses.replace(
        row, prompt_hash=hashes.get(parent_id(row.request_id)),
        digest=digest(row)[0], digest_detail=digest(row)[1]) for row in series)


class WeatherWitness:
    """One weather cell's evidence on its pair: /metrics before, then a judgement per look."""

    def __init__(self, cell: Cell, pair: Deployment, records_path: Path,
                 digests: DigestFiles) -> None:
        self.cell, self.pair, self.records_path, self.digests = cell, pair, records_path, digests
        self.weather: Weather = weather_for(cell.weather)
        self.params = resolved_params(cell.weather, cell.weather_settings)
        self.before: dict[str, dict[str, float]] = {}
        self.disturbance = self.weather.disturbance(cell, self.params)
        self.sustain = self.weather.sustain(cell, self.params)
        self.proxy_url = ""
        self.series: tuple[RequestRow, ...] | None = None   # sent once, after the first look
        self.series_s = 0.0

    @property
    def workload(self) -> Workload:
        return self.weather.workload(self.cell, self.params)

    def start(self, proxy_url: str = "") -> "WeatherWitness":
        self.before = samples_of(self.pair)
        self.proxy_url = proxy_url
        if self.disturbance is not None:
            self.disturbance.start(self.pair, proxy_url)
        return self

    def records(self) -> list[dict]:
        return read_proxy_records(str(self.records_path))

    def answered_records(self, pd_run: EvalRun) -> list[dict]:
        """The proxy's records of the questions answered with a 200 (the transfer proof's)."""
        answered = {q.prompt_hash for q in pd_run.questions if q.error is None}
        return [r for r in self.records() if r.get("prompt_hash") in answered]

    def judge(self, pd_run: EvalRun, base_run: EvalRun) -> WeatherJudgement:
        timeline = (self.disturbance.finish(DISTURBANCE_TIMEOUT_S)
                    if self.disturbance is not None else ())
        if self.sustain is not None and self.series is None:
            started = time.monotonic()
            self.series = self.sustain.run(self.proxy_url, series_questions(pd_run, base_run))
            self.series_s = time.monotonic() - started
        time.sleep(self.weather.settle_s(self.params))   # what must hold "afterwards"
        records = self.records()
        if self.digests.skipped:   # nothing proves a 200 right: each says why
            digests = {str(r.get("request_id")): (NOT_DIGESTED, self.digests.skipped)
                       for r in records}
        else:
            digests = request_digests(records, self.digests.prefill, self.digests.decode,
                                      self.digests.decode_block_size)
        # a child's row (OpenAI n > 1) names its parent request: "<proxy id>#<i>"
        series_ids = {parent_id(r.request_id) for r in self.series or () if r.request_id}
        rows = request_rows(pd_run, base_run, [r for r in records if r.get("request_id")
                                               not in series_ids], digests)
        rows += with_digests(self.series or (), digests, records)
        run = WeatherRun(cell=self.cell, params=self.params, rows=rows,
                         proxy_records=tuple(records), metrics_before=self.before,
                         metrics_after=samples_of(self.pair),
                         logs={name: str(proc.log_path) for name, proc in self.pair.processes.items()},
                         timeline=timeline)
        events = self.weather.events(run)
        return WeatherJudgement(
            weather=self.cell.weather, params=dict(self.params), rows=with_events(rows, events),
            events=events, conditions=self.weather.conditions(run),
            failure_budget=self.weather.failure_budget(run, events),
            unhealthy=unhealthy(self.pair),
            accounted_checks=self.weather.accounted_checks(self.params),
            series_window=self.sustain.window if self.sustain is not None else 0,
            **({"series_noun": self.sustain.noun} if self.sustain is not None else {}),
            series_wall_s=self.series_s)


__all__ = ["WeatherWitness", "answered_only", "client_status", "request_rows", "weather_plan",
           "with_events"]
