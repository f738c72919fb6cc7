"""block-boundary: prompts of k*block-1, k*block and k*block+1 tokens (vLLM #50558: a prompt an
exact multiple of the block size, plus a proxy's appended token, made the decode allocate one
block more than the prefill sent, and crash).

The prompts are the task's own, padded (harness.zoo.boundary: the group asks the variant
gsm_synth_boundary, and so does its baseline, so the answers stay comparable) onto k*128-1,
k*128, k*128+1 tokens in turn: a boundary of every block size dividing 128 (matrix rule
boundary-blocks), the prefill's and the decode's alike when they differ. The harness's proxy
appends no token to the decode's prompt, so both hops see the same count. Nothing is injected:
every request must answer 200 with its prefill's KV.

Per request, the event names the boundary it hit, proven by the prefill's own count
(usage.prompt_tokens in the proxy's record). It blew when every request with a prefill answer
was counted, each on a boundary of both block sizes, and every offset -1, 0, +1 was hit.
"""
from __future__ import annotations

from typing import Mapping

from harness.core.cell import Cell
from harness.judge.weather import InjectedEvent, WeatherCondition
from harness.run.weather.base import Weather, WeatherRun, Workload
from harness.zoo.boundary import OFFSETS, boundary_of

KIND = "prompt-at-block-boundary"


def offset_name(offset: int) -> str:
    return {-1: "k*block-1", 0: "k*block", 1: "k*block+1"}[offset]


def counted(records: tuple[dict, ...]) -> list[dict]:
    """The records whose prefill answered (and so counted the prompt)."""
    return [r for r in records if r.get("prefill_status") == 200]


class BlockBoundary(Weather):
    name = "block-boundary"

    def workload(self, cell: Cell, params: Mapping[str, float]) -> Workload:
        return Workload(min_questions=int(params["min_questions"]))

    def events(self, run: WeatherRun) -> tuple[InjectedEvent, ...]:
        blocks = {"prefill": run.cell.prefill_block_size, "decode": run.cell.decode_block_size}
        out = []
        for r in counted(run.proxy_records):
            tokens = r.get("prompt_tokens")
            if not isinstance(tokens, int):
                continue
            hit = {role: boundary_of(tokens, b) for role, b in blocks.items()}
            where = "; ".join(
                f"{role} block {b}: {tokens // b if hit[role] != -1 else tokens // b + 1}*{b}"
                f"{hit[role]:+d}" if hit[role] is not None else f"{role} block {b}: no boundary"
                for role, b in blocks.items())
            out.append(InjectedEvent(
                f"{KIND}{'' if hit['decode'] is None else ' ' + offset_name(hit['decode'])}",
                r.get("request_id"), f"prompt {tokens} tokens (prefill usage.prompt_tokens); {where}",
                may_fail=False))
        return tuple(out)

    def conditions(self, run: WeatherRun) -> tuple[WeatherCondition, ...]:
        records = counted(run.proxy_records)
        tokens = [r.get("prompt_tokens") for r in records]
        uncounted = sum(not isinstance(t, int) for t in tokens)
        counts = [t for t in tokens if isinstance(t, int)]
        out = [WeatherCondition(
            "happened", "prompts-counted", bool(records) and uncounted == 0,
            f"{len(counts)} of {len(records)} prefill answers gave usage.prompt_tokens")]
        for role, block in (("prefill", run.cell.prefill_block_size),
                            ("decode", run.cell.decode_block_size)):
            hits = [boundary_of(t, block) for t in counts]
            off = sum(h is None for h in hits)
            per = {o: hits.count(o) for o in OFFSETS}
            missing = [offset_name(o) for o, n in per.items() if n == 0]
            out.append(WeatherCondition(
                "happened", f"boundaries-hit[{role}]", bool(counts) and not off and not missing,
                f"{role} block {block}: " + ", ".join(f"{offset_name(o)} {n}" for o, n in per.items())
                + f", off a boundary {off}" + (f"; never hit: {', '.join(missing)}" if missing else "")))
        return tuple(out)


WEATHER = BlockBoundary()
