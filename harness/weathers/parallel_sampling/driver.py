"""parallel-sampling: after the first look the pair is asked each of the look's questions once
more with ``n`` children (OpenAI ``n``, temperature 1, ``top_k``, the look's seed). The harness's
proxy prefills the prompt once (its prefill hop asks n = 1) and the decode spawns the children
(vLLM's ParentRequest: request ids ``<i>_<parent>``), each of which must read the prompt's KV
the prefill computed: the decode's digest plugin writes one line per child, and each child is a
row of its own (``<proxy id>#<i>``): a 200 whose child holds no digest (it recomputed its
prompt) or a differing one is a silent wrong answer (Dynamo saw only one child's KV handoff
survive). A child may take some blocks from a sibling's copy in the decode's prefix cache: its
digest then covers the blocks it received.

The children's answers are sampled, not greedy (at top_k 1 two children of a clean CPU pair
differed on 1 of 12 prompts), so they are judged statistically, not by identity: ``children-agree``
FAILs when the share of children whose answer differs from the baseline's answer to the same
question is above ``TOLERATED_DISAGREEMENT`` beyond chance (one-sided exact binomial, alpha
0.01). Every child reads the prompt's blocks: the connector moves n times a request's bytes,
so the aggregate ``kv-bytes-exact`` is replaced by the digest per child.
"""
from __future__ import annotations

import asyncio
import uuid
from typing import Mapping

from scipy import stats as sps

from harness.core.cell import Cell
from harness.judge.weather import MISSING, RequestRow, WeatherCondition
from harness.run.evidence.kv_digest_evidence import CHILD_MARK, parent_id
from harness.run.weather.base import SeriesQuestion, Sustain, Weather, WeatherRun
from harness.run.weather.tagged import counted
from harness.serve.proxy.upstream import REQUEST_ID_HEADER
from harness.zoo.probe import STRICT_RE

TOLERATED_DISAGREEMENT = 0.05    # children differing from the baseline's answer, at most
AGREE_ALPHA = 0.01
REQUEST_TIMEOUT_S = 300.0


def strict_answer(text: str) -> str:
    """The answer lm-eval's strict-match filter extracts ("[invalid]" without one)."""
    match = STRICT_RE.search(text or "")
    return match.group(1).strip() if match else "[invalid]"


def child_id(request_id: str, index: int) -> str:
    """A child's row id: "<proxy request id>#<child index>"."""
    return f"{request_id}{CHILD_MARK}{index}"


def sampled_body(payload: Mapping, n: int, top_k: int, salt: str) -> dict:
    """The look's request for a question, asking `n` seeded children (vLLM refuses n > 1 at
    temperature 0) and a prefix-cache salt of its own (prefilled and sent afresh)."""
    return {**payload, "n": n, "temperature": 1.0, "top_k": top_k, "cache_salt": salt}


def child_rows(request_id: str | None, payload: dict | None, status: int, n: int,
               question: SeriesQuestion, first_index: int) -> list[RequestRow]:
    """One row per child of an answered request (by the choice's index); a child missing from
    the answer is a failed row of its own."""
    choices = {int(c.get("index", 0)): c for c in (payload or {}).get("choices") or ()}
    rows = []
    for i in range(n):
        base = dict(request_id=child_id(request_id or "?", i), doc_id=question.doc_id,
                    prompt_hash=None, status=status, digest=MISSING, series_index=first_index + i)
        choice = choices.get(i)
        if choice is None or choice.get("finish_reason") == "error":
            rows.append(RequestRow(error="no such child in the answer" if choice is None
                                   else 'finish_reason "error"', **base))
            continue
        answer = strict_answer(choice.get("text") or "")
        rows.append(RequestRow(error=None, answer=answer,
                               agrees=answer == question.baseline_answer, **base))
    return rows


class ChildrenDriver(Sustain):
    """Each question once, `n` children, `in_flight` requests at a time."""

    def __init__(self, n: int, top_k: int, in_flight: int = 4) -> None:
        self.n, self.top_k, self.in_flight = n, top_k, in_flight
        self.window = 1    # one window of every child: judged together (children-agree)
        self.noun = ("child", "children")

    def run(self, proxy_url: str, questions: list[SeriesQuestion]) -> tuple[RequestRow, ...]:
        if not questions:
            return ()
        rows = tuple(asyncio.run(self._all(proxy_url.rstrip("/") + "/v1/completions",
                                           questions)))
        self.window = max(1, len(rows))
        return rows

    async def _all(self, url: str, questions: list[SeriesQuestion]) -> list[RequestRow]:
        import aiohttp

        salt, gate = uuid.uuid4().hex[:12], asyncio.Semaphore(self.in_flight)
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async def one(k: int, q: SeriesQuestion) -> list[RequestRow]:
                body = sampled_body(q.payload, self.n, self.top_k, f"children-{salt}-{k}")
                async with gate:
                    return await self._ask(session, url, body, q, k * self.n)
            done = await asyncio.gather(*(one(k, q) for k, q in enumerate(questions)))
        return [row for rows in done for row in rows]

    async def _ask(self, session, url: str, body: dict, q: SeriesQuestion,
                   first: int) -> list[RequestRow]:
        import aiohttp

        try:
            async with session.post(url, json=body) as response:
                rid = response.headers.get(REQUEST_ID_HEADER)
                if response.status != 200:
                    error = f"HTTP {response.status} {(await response.text())[:200]}"
                    return [RequestRow(request_id=rid, doc_id=q.doc_id, prompt_hash=None,
                                       status=response.status, error=error, digest=MISSING,
                                       series_index=first)]
                payload = await response.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            return [RequestRow(request_id=None, doc_id=q.doc_id, prompt_hash=None, status=None,
                               error=f"{type(exc).__name__}: {str(exc)[:200]}",
                               digest=MISSING, series_index=first)]
        return child_rows(rid, payload, 200, self.n, q, first)


def agreement_condition(rows: tuple[RequestRow, ...]) -> WeatherCondition:
    """children-agree: the children's disagreement with the baseline's answer is not above
    TOLERATED_DISAGREEMENT beyond chance (exact one-sided binomial test, alpha AGREE_ALPHA)."""
    answered = [r for r in rows if r.answered]
    differ = sum(not r.agrees for r in answered)
    p = (float(sps.binomtest(differ, len(answered), TOLERATED_DISAGREEMENT,
                             alternative="greater").pvalue) if answered else 1.0)
    return WeatherCondition(
        "holds", "children-agree", bool(p >= AGREE_ALPHA),   # a JSON bool in the record
        f"{differ} of {len(answered)} children answer otherwise than the baseline (binomial "
        f"p {p:.3g} against {TOLERATED_DISAGREEMENT:.0%} tolerated, alpha {AGREE_ALPHA})")


class ParallelSampling(Weather):
    name = "parallel-sampling"

    def sustain(self, cell: Cell, params: Mapping[str, float]) -> ChildrenDriver:
        return ChildrenDriver(int(params["n"]), int(params["top_k"]))

    def accounted_checks(self, params: Mapping[str, float]) -> dict[str, str]:
        return {"kv-bytes-exact": "every child reads its prompt's blocks: the connector moves "
                                  "n times a request's bytes; the digest per child says each "
                                  "read is its prefill's"}

    def conditions(self, run: WeatherRun) -> tuple[WeatherCondition, ...]:
        children = tuple(r for r in run.rows if CHILD_MARK in str(r.request_id or ""))
        asked = {parent_id(r.request_id) for r in children}
        wanted = len(asked) * int(run.params["n"])
        return (counted("children-sampled", "happened", len(children), wanted,
                        f"children answered for {len(asked)} requests of n = "
                        f"{int(run.params['n'])}"),
                agreement_condition(children))


WEATHER = ParallelSampling()
