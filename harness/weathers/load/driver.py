"""load: >= 64 requests in flight, prefix caching on, and P/D KV caches of a few dozen blocks, so
that every block is recycled many times during the run (the issue's concurrency class:
corruption that only shows once blocks are reused). Nothing is injected: any failure is
unaccounted, and must not happen.

That it blew is proven, not assumed: each P/D server's log states its KV cache's size (vLLM's
"KV cache size: N tokens" line, N = blocks x block size), its /metrics count the blocks evicted
for reuse (``--kv-cache-metrics`` at sample rate 1: every block's lifetime ends in one
observation), and the proxy's records show how many requests were in flight at once.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Mapping

from harness.core.cell import Cell
from harness.weathers.facts import ServerChanges
from harness.judge.weather import WeatherCondition
from harness.run.weather.base import Weather, WeatherRun, Workload

# vLLM 0.32 kv_cache_utils.update_kv_cache_capacity, once per engine
KV_CACHE_SIZE_RE = re.compile(r"KV cache size: ([\d,]+) tokens")
EVICTED_SAMPLE = "vllm:kv_block_lifetime_seconds_count"
RECYCLES_WANTED = 3.0        # blocks evicted for reuse, in multiples of the cache: "many times"
IN_FLIGHT_SHARE = 0.9        # of `in_flight`, at the busiest instant the proxy saw


def max_in_flight(records: tuple[dict, ...]) -> int:
    """The most requests the proxy held at once (each from its start to both hops' end)."""
    edges = []
    for r in records:
        try:
            start = dt.datetime.fromisoformat(r["started_at"]).timestamp()
        except (KeyError, TypeError, ValueError):
            continue
        end = start + ((r.get("prefill_ms") or 0) + (r.get("decode_ms") or 0)) / 1000.0
        edges += [(start, 1), (end, -1)]
    busiest = current = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):
        current += step
        busiest = max(busiest, current)
    return busiest


def cache_tokens(log: str) -> int | None:
    match = KV_CACHE_SIZE_RE.search(log)
    return int(match.group(1).replace(",", "")) if match else None


class Load(Weather):
    name = "load"

    def servers(self, cell: Cell, params: Mapping[str, float]) -> dict[str, ServerChanges]:
        in_flight = int(params["in_flight"])
        changes = ServerChanges(num_blocks=int(params["kv_blocks"]), prefix_caching=True,
                                max_num_seqs=max(in_flight, 128),
                                extra_args=("--kv-cache-metrics", "--kv-cache-metrics-sample", "1.0"))
        return {"prefill": changes, "decode": changes}

    def workload(self, cell: Cell, params: Mapping[str, float]) -> Workload:
        in_flight = int(params["in_flight"])
        return Workload(in_flight=in_flight, min_questions=2 * in_flight)

    def conditions(self, run: WeatherRun) -> tuple[WeatherCondition, ...]:
        blocks = int(run.params["kv_blocks"])
        in_flight = int(run.params["in_flight"])
        out = []
        for server in sorted(run.logs):
            if not server.startswith(("prefill", "decode")):
                continue
            block = (run.cell.prefill_block_size if server.startswith("prefill")
                     else run.cell.decode_block_size)
            tokens = cache_tokens(run.log_text(server))
            out.append(WeatherCondition(
                "happened", f"kv-cache-blocks[{server}]",
                tokens is not None and tokens // block == blocks,
                f"{server}'s log: KV cache of {tokens if tokens is not None else '?'} tokens = "
                f"{'?' if tokens is None else tokens // block} blocks of {block} (wanted {blocks})"))
            evicted = run.metric_delta(server, EVICTED_SAMPLE)
            out.append(WeatherCondition(
                "happened", f"blocks-recycled[{server}]", evicted >= RECYCLES_WANTED * blocks,
                f"{server} evicted {evicted:.0f} blocks for reuse = {evicted / blocks:.1f}x its "
                f"{blocks}-block cache (wanted >= {RECYCLES_WANTED:g}x; {EVICTED_SAMPLE})"))
        busiest = max_in_flight(run.proxy_records)
        out.append(WeatherCondition(
            "happened", "in-flight", busiest >= IN_FLIGHT_SHARE * in_flight,
            f"at most {busiest} requests in flight at the proxy (asked {in_flight}; "
            f"wanted >= {IN_FLIGHT_SHARE * in_flight:.0f})"))
        return tuple(out)


WEATHER = Load()
