"""Scrape vLLM servers' Prometheus /metrics and reduce them to the connector-neutral transfer
counters the verdict needs; `TransferCounters.delta` gives what one evaluation moved.

The prompt-token sources are vLLM's own (the decode's); the transfer counters come through the
cell's connector's metric map (its ``MetricMap``, harness.connectors.driver, handed in as a
:class:`CounterMap`), from the role whose servers count them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping, Protocol, Sequence

from harness.core import exact_headers
from prometheus_client.parser import text_string_to_metric_families

SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


_SPEC_COUNTERS = {"vllm:spec_decode_num_drafts_total": "spec_drafts",
                  "vllm:spec_decode_num_draft_tokens_total": "spec_draft_tokens",
                  "vllm:spec_decode_num_accepted_tokens_total": "spec_accepted_tokens"}


class CounterMap(Protocol):
    """A connector's /metrics samples as neutral counters, by the role whose servers count them."""

    def counters_from(self, role: str) -> Mapping[str, str]:
        """The samples a server of ``role`` contributes: sample name -> TransferCounters field."""
        ...


@dataclass(frozen=True)
class TransferCounters:
    prompt_tokens_local: float = 0.0        # source="local_compute": decode computed itself
    prompt_tokens_cache_hit: float = 0.0    # source="local_cache_hit": decode's own prefix cache
    prompt_tokens_external: float = 0.0     # source="external_kv_transfer": arrived through the connector
    kv_bytes: float = 0.0                   # bytes the connector says it moved
    kv_transfers: float = 0.0               # transfers it counted
    failed_transfers: float = 0.0
    failed_notifications: float = 0.0
    expired_requests: float = 0.0
    requests_finished: float = 0.0          # vllm:request_success_total (all reasons, decode)
    # speculative decoding on the decode: its verify steps with drafts, the tokens its drafter
    # proposed and those the target accepted (check spec-acceptance judges the answers' own
    # per-request counts and holds them to these)
    spec_drafts: float = 0.0                # vllm:spec_decode_num_drafts_total
    spec_draft_tokens: float = 0.0          # vllm:spec_decode_num_draft_tokens_total
    spec_accepted_tokens: float = 0.0       # vllm:spec_decode_num_accepted_tokens_total

    @property
    def prompt_tokens_total(self) -> float:
        return self.prompt_tokens_local + self.prompt_tokens_cache_hit + self.prompt_tokens_external

    def delta(self, before: "TransferCounters") -> "TransferCounters":
        return TransferCounters(**{k: getattr(self, k) - getattr(before, k) for k in asdict(self)})

    def plus(self, other: "TransferCounters") -> "TransferCounters":
        return TransferCounters(**{k: getattr(self, k) + getattr(other, k) for k in asdict(self)})

    def to_dict(self) -> dict[str, float]:
        d = asdict(self)
        d["prompt_tokens_total"] = self.prompt_tokens_total
        return d


def parse_transfer_counters(text: str, counters: CounterMap | None = None,
                            role: str = "decode") -> TransferCounters:
    """Sum the samples a server of `role` contributes over all label sets (engines, model
    names): the decode's prompt-token sources and finished requests, and the transfer counters
    the connector's map `counters` puts on `role` (None: vLLM's own samples only)."""
    mapped = counters.counters_from(role) if counters is not None else {}
    acc = {k: 0.0 for k in asdict(TransferCounters())}
    by_source = {s: 0.0 for s in SOURCES}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name in mapped:
                acc[mapped[name]] += value
            elif role != "decode":
                continue
            elif name == "vllm:prompt_tokens_by_source_total":
                src = labels.get("source")
                if src in by_source:
                    by_source[src] += value
            elif name == "vllm:request_success_total":
                acc["requests_finished"] += value
            elif name in _SPEC_COUNTERS:
                acc[_SPEC_COUNTERS[name]] += value
    acc["prompt_tokens_local"] = by_source["local_compute"]
    acc["prompt_tokens_cache_hit"] = by_source["local_cache_hit"]
    acc["prompt_tokens_external"] = by_source["external_kv_transfer"]
    return TransferCounters(**acc)


def scrape(base_url: str, timeout_s: float = 10.0, counters: CounterMap | None = None,
           role: str = "decode") -> TransferCounters:
    resp = exact_headers.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout_s)
    resp.raise_for_status()
    return parse_transfer_counters(resp.text, counters, role)


def scrape_all(base_urls: Sequence[str], timeout_s: float = 10.0,
               counters: CounterMap | None = None, role: str = "decode") -> TransferCounters:
    """Sum counters over several servers of one role (e.g. all decode instances)."""
    total = TransferCounters()
    for url in base_urls:
        total = total.plus(scrape(url, timeout_s, counters, role))
    return total


def scrape_pair(urls_by_role: Mapping[str, Sequence[str]], counters: CounterMap,
                timeout_s: float = 10.0) -> TransferCounters:
    """A P/D pair's counters: each role's servers contribute what the connector's map
    `counters` puts on it (a role without a mapped counter is not scraped, except the decode:
    the prompt tokens)."""
    total = TransferCounters()
    for role, urls in urls_by_role.items():
        if role == "decode" or counters.counters_from(role):
            total = total.plus(scrape_all(list(urls), timeout_s, counters, role))
    return total


def parse_samples(text: str) -> dict[str, float]:
    """Every sample of a /metrics page summed over its label sets, by sample name (what a weather
    reads beyond the transfer counters: vllm:num_preemptions_total, vllm:kv_cache_usage_perc ...)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def scrape_samples(base_url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """`parse_samples` of one server's /metrics page."""
    resp = exact_headers.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout_s)
    resp.raise_for_status()
    return parse_samples(resp.text)
