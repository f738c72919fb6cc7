"""soak: load's weather (64 in flight, prefix caching on, 48-block P/D caches) held for thousands
of requests: after the first look, the pair is asked the look's questions again and again
(2,000 requests by default on CPU, 20,000 on a GPU), each with a cache_salt of its own so that
every request is prefilled, transferred and digested afresh while its blocks recycle. Each
request's answer is compared with the baseline's answer to the same question (the baseline
answered it once, in the first look; it is not asked again).

The judge (harness.judge.weather) then reads the soak in windows of 100 requests: any request
whose KV is not its prefill's, or that failed, FAILs the cell, and so does a downward trend of
the windows' agreement beyond chance (Mann-Kendall, one-sided, alpha 0.01). It catches what
calm looks of a few hundred requests never reach: corruption that starts after ~100 requests
and worsens (SGLang #23020), or shows only under long steady load (vLLM #52627, #58222).

``fail_share`` > 0 reports every read of that share of the questions failed (the decode's
fail-transfer fault, by prompt hash: the same questions every cycle), so the blocks of failed
reads are freed and reused by the next requests all soak long (vLLM #56104), and each failed
read must be answered loudly, never a 200 (#52234).
"""
from __future__ import annotations

import asyncio
import re
import uuid
from dataclasses import replace
from typing import Mapping

from harness.core.cell import Cell
from harness.weathers.facts import ServerChanges
from harness.judge.weather import MISSING, InjectedEvent, RequestRow, WeatherCondition
from harness.run.weather.base import SeriesQuestion, Sustain, WeatherRun, Workload
from harness.weathers.load.driver import EVICTED_SAMPLE, Load
from harness.run.weather.tagged import SERVER_FAULT_ENV, counted, events_of, share_tag, tagged_records
from harness.protocol.faults import FAIL_TRANSFER, FaultSpec, request_fault_tag

DEFAULT_REQUESTS = {"cpu": 2_000, "cuda": 20_000}
RECYCLES_WANTED = 10.0      # blocks evicted for reuse, in multiples of the cache: "many times"
# lm-eval's gsm8k strict-match, the filter every packaged task scores with (harness/eval/tasks)
STRICT_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")
REQUEST_ID_HEADER = "X-Request-Id"
FAIL_MARKER = request_fault_tag(FaultSpec(kind=FAIL_TRANSFER))
REQUEST_TIMEOUT_S = 300.0


def strict_answer(text: str) -> str:
    """The answer lm-eval's strict-match filter extracts ("[invalid]" without one)."""
    match = STRICT_ANSWER.search(text or "")
    return match.group(1).strip() if match else "[invalid]"


def soak_requests(cell: Cell, params: Mapping[str, float]) -> int:
    return int(params["requests"]) or DEFAULT_REQUESTS.get(cell.device, DEFAULT_REQUESTS["cpu"])


class SoakDriver(Sustain):
    """`requests` requests through the proxy, `in_flight` at a time, cycling the questions."""

    noun = ("soak request", "soak requests")

    def __init__(self, requests: int, in_flight: int, window: int,
                 timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.requests, self.in_flight, self.window = requests, in_flight, window
        self.timeout_s = timeout_s

    def run(self, proxy_url: str, questions: list[SeriesQuestion]) -> tuple[RequestRow, ...]:
        if not questions:
            return ()
        return tuple(asyncio.run(self._all(proxy_url.rstrip("/"), questions)))

    async def _all(self, url: str, questions: list[SeriesQuestion]) -> list[RequestRow]:
        import aiohttp

        salt = uuid.uuid4().hex[:12]
        gate = asyncio.Semaphore(self.in_flight)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        connector = aiohttp.TCPConnector(limit=self.in_flight)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            async def one(index: int) -> RequestRow:
                question = questions[index % len(questions)]
                # its own salt: no prefix-cache hit, every request prefilled and sent afresh
                body = {**question.payload, "cache_salt": f"soak-{salt}-{index}"}
                async with gate:
                    return await ask(session, f"{url}/v1/completions", body, index, question)
            return list(await asyncio.gather(*(one(i) for i in range(self.requests))))


async def ask(session, url: str, body: dict, index: int, question: SeriesQuestion) -> RequestRow:
    """One soak request's row (its digest is the witness's to add)."""
    import aiohttp

    base = dict(doc_id=question.doc_id, prompt_hash=None, digest=MISSING, series_index=index)
    try:
        async with session.post(url, json=body) as response:
            request_id = response.headers.get(REQUEST_ID_HEADER)
            payload = await response.json(content_type=None) if response.status == 200 else None
            if response.status != 200:
                text = (await response.text())[:200]
                return RequestRow(request_id=request_id, status=response.status,
                                  error=f"HTTP {response.status} {text}", **base)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        return RequestRow(request_id=None, status=None,
                          error=f"{type(exc).__name__}: {str(exc)[:200]}", **base)
    choice = ((payload or {}).get("choices") or [{}])[0]
    if choice.get("finish_reason") == "error":
        return RequestRow(request_id=request_id, status=200, error='finish_reason "error"', **base)
    answer = strict_answer(choice.get("text") or "")
    return RequestRow(request_id=request_id, status=200, error=None, answer=answer,
                      agrees=answer == question.baseline_answer, **base)


class Soak(Load):
    name = "soak"

    def servers(self, cell: Cell, params: Mapping[str, float]) -> dict[str, ServerChanges]:
        changes = super().servers(cell, params)
        if params["fail_share"] > 0:     # the decode's fault plugin, armed for tagged requests
            decode = changes["decode"]
            changes["decode"] = replace(decode, extra_env=decode.extra_env + SERVER_FAULT_ENV)
        return changes

    def workload(self, cell: Cell, params: Mapping[str, float]) -> Workload:
        first = super().workload(cell, params)
        tag = (share_tag(FAIL_MARKER, params["fail_share"]) if params["fail_share"] > 0 else None)
        return Workload(in_flight=first.in_flight, min_questions=first.min_questions,
                        request_tag=tag)

    def sustain(self, cell: Cell, params: Mapping[str, float]) -> SoakDriver:
        return SoakDriver(soak_requests(cell, params), int(params["in_flight"]),
                          int(params["window"]))

    def events(self, run: WeatherRun) -> tuple[InjectedEvent, ...]:
        if run.params["fail_share"] <= 0:
            return ()
        return events_of(tagged_records(run, FAIL_MARKER), "read-failed",
                         lambda r: "the decode's read reported failed (fail-transfer)")

    def accounted_checks(self, params: Mapping[str, float]) -> dict[str, str]:
        if params["fail_share"] <= 0:
            return {}
        why = "reads of a share of the questions are reported failed on purpose"
        return {"no-failed-transfers": why, "kv-bytes-exact": why}

    def conditions(self, run: WeatherRun) -> tuple[WeatherCondition, ...]:
        blocks = int(run.params["kv_blocks"])
        load = [c if not c.name.startswith("blocks-recycled") else recycled(run, c, blocks)
                for c in super().conditions(run)]
        wanted = soak_requests(run.cell, run.params)
        sent = sum(r.series_index is not None for r in run.rows)
        out = load + [counted("soak-requests", "happened", sent, wanted,
                              "requests the soak sent after the first look")]
        if run.params["fail_share"] > 0:
            failed = tagged_records(run, FAIL_MARKER)
            loud = sum(r.get("decode_status") not in (None, 200) or bool(r.get("error"))
                       for r in failed)
            out.append(counted("failed-reads-loud", "holds", loud, len(failed),
                               "requests whose read was reported failed, answered with an error"))
        return tuple(out)


def recycled(run: WeatherRun, condition: WeatherCondition, blocks: int) -> WeatherCondition:
    """load's blocks-recycled condition, held to the soak's RECYCLES_WANTED."""
    server = condition.name[len("blocks-recycled["):-1]
    evicted = run.metric_delta(server, EVICTED_SAMPLE)
    return WeatherCondition(
        "happened", condition.name, evicted >= RECYCLES_WANTED * blocks,
        f"{server} evicted {evicted:.0f} blocks for reuse = {evicted / blocks:.1f}x its "
        f"{blocks}-block cache (wanted >= {RECYCLES_WANTED:g}x; {EVICTED_SAMPLE})")


WEATHER = Soak()
