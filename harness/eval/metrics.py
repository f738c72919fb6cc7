"""Scrape a vLLM server's Prometheus /metrics and reduce it to the transfer counters the
verdict needs; `TransferCounters.delta` gives what one evaluation moved."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from harness.core import exact_headers
from prometheus_client.parser import text_string_to_metric_families

SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


@dataclass(frozen=True)
class TransferCounters:
    prompt_tokens_local: float = 0.0        # source="local_compute": decode computed itself
    prompt_tokens_cache_hit: float = 0.0    # source="local_cache_hit": decode's own prefix cache
    prompt_tokens_external: float = 0.0     # source="external_kv_transfer": arrived over NIXL
    nixl_bytes: float = 0.0                 # vllm:nixl_bytes_transferred_sum
    nixl_transfers: float = 0.0             # vllm:nixl_bytes_transferred_count
    nixl_failed_transfers: float = 0.0
    nixl_failed_notifications: float = 0.0
    nixl_expired_requests: float = 0.0
    requests_finished: float = 0.0          # vllm:request_success_total (all reasons)

    @property
    def prompt_tokens_total(self) -> float:
        return self.prompt_tokens_local + self.prompt_tokens_cache_hit + self.prompt_tokens_external

    def delta(self, before: "TransferCounters") -> "TransferCounters":
        return TransferCounters(**{k: getattr(self, k) - getattr(before, k) for k in asdict(self)})

    def to_dict(self) -> dict[str, float]:
        d = asdict(self)
        d["prompt_tokens_total"] = self.prompt_tokens_total
        return d


def parse_transfer_counters(text: str) -> TransferCounters:
    """Sum the relevant samples over all label sets (engines, model names)."""
    acc = {k: 0.0 for k in asdict(TransferCounters())}
    by_source = {s: 0.0 for s in SOURCES}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name == "vllm:prompt_tokens_by_source_total":
                src = labels.get("source")
                if src in by_source:
                    by_source[src] += value
            elif name == "vllm:nixl_bytes_transferred_sum":
                acc["nixl_bytes"] += value
            elif name == "vllm:nixl_bytes_transferred_count":
                acc["nixl_transfers"] += value
            elif name == "vllm:nixl_num_failed_transfers_total":
                acc["nixl_failed_transfers"] += value
            elif name == "vllm:nixl_num_failed_notifications_total":
                acc["nixl_failed_notifications"] += value
            elif name == "vllm:nixl_num_kv_expired_reqs_total":
                acc["nixl_expired_requests"] += value
            elif name == "vllm:request_success_total":
                acc["requests_finished"] += value
    acc["prompt_tokens_local"] = by_source["local_compute"]
    acc["prompt_tokens_cache_hit"] = by_source["local_cache_hit"]
    acc["prompt_tokens_external"] = by_source["external_kv_transfer"]
    return TransferCounters(**acc)


def scrape(base_url: str, timeout_s: float = 10.0) -> TransferCounters:
    resp = exact_headers.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout_s)
    resp.raise_for_status()
    return parse_transfer_counters(resp.text)


def scrape_all(base_urls: list[str], timeout_s: float = 10.0) -> TransferCounters:
    """Sum counters over several servers (e.g. all decode instances)."""
    total = TransferCounters()
    for url in base_urls:
        one = scrape(url, timeout_s)
        total = TransferCounters(**{k: getattr(total, k) + getattr(one, k) for k in asdict(total)})
    return total
