"""Transfer counters from a vLLM /metrics page: parsing, summing engines, deltas, scraping."""
from __future__ import annotations

import http.server
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

import pytest
import requests

from harness.eval import metrics
from harness.eval.metrics import TransferCounters
from harness.connectors import connector_for

NIXL = connector_for("nixl").metrics     # the decode reads: its pages carry the transfer counters


def parse_transfer_counters(text: str, role: str = "decode") -> TransferCounters:
    return metrics.parse_transfer_counters(text, NIXL, role)


def scrape(url: str) -> TransferCounters:
    return metrics.scrape(url, counters=NIXL)


def scrape_all(urls: list[str]) -> TransferCounters:
    return metrics.scrape_all(urls, counters=NIXL)

DATA = Path(__file__).resolve().parents[1] / "data" / "metrics"
AFTER_PD = (DATA / "decode_after_pd_request.txt").read_text()
TWO_ENGINES = (DATA / "decode_two_engines.txt").read_text()


def test_decode_server_after_one_pd_request():
    c = parse_transfer_counters(AFTER_PD)
    assert c.prompt_tokens_external == 1088.0
    assert c.prompt_tokens_local == 0.0
    assert c.prompt_tokens_cache_hit == 0.0
    assert c.prompt_tokens_total == 1088.0
    assert c.kv_bytes == pytest.approx(1.1e6)
    assert c.kv_transfers == 1.0
    assert c.failed_transfers == 0.0
    assert c.failed_notifications == 0.0
    assert c.expired_requests == 0.0
    # every finished reason counts
    assert c.requests_finished == 1.0


def test_two_engines_are_summed():
    c = parse_transfer_counters(TWO_ENGINES)
    assert c.prompt_tokens_local == 5.0
    assert c.prompt_tokens_cache_hit == 16.0
    assert c.prompt_tokens_external == 1500.0
    assert c.prompt_tokens_total == 1521.0
    assert c.kv_bytes == pytest.approx(4.0e6)
    assert c.kv_transfers == 8.0
    assert c.failed_transfers == 3.0
    assert c.failed_notifications == 1.0
    # the pull's lease expirations are the prefill's (it holds the leases), not the decode's
    assert c.expired_requests == 0.0
    assert parse_transfer_counters(TWO_ENGINES, role="prefill").expired_requests == 4.0
    assert c.requests_finished == 8.0


def test_server_without_nixl_metrics_reads_as_zero():
    # a baseline server (no connector) exposes only the by-source counter
    text = "\n".join(line for line in AFTER_PD.splitlines() if "nixl" not in line) + "\n"
    c = parse_transfer_counters(text)
    assert c.kv_bytes == 0.0 and c.kv_transfers == 0.0
    assert c.prompt_tokens_external == 1088.0
    assert parse_transfer_counters("") == TransferCounters()


def test_a_speculating_decode_counts_drafted_and_accepted_tokens():
    """vLLM 0.32 CPU's counters after a self-drafting request (draft_model, 3 tokens: 10 drafts,
    all 30 tokens accepted)."""
    text = AFTER_PD + (
        '# TYPE vllm:spec_decode_num_draft_tokens counter\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny-llama-gsm"} 30.0\n'
        '# TYPE vllm:spec_decode_num_accepted_tokens counter\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny-llama-gsm"} 30.0\n')
    c = parse_transfer_counters(text)
    assert (c.spec_draft_tokens, c.spec_accepted_tokens) == (30.0, 30.0)
    assert parse_transfer_counters(AFTER_PD).spec_draft_tokens == 0.0


def test_delta_subtracts_every_field():
    before = parse_transfer_counters(AFTER_PD)
    after = parse_transfer_counters(TWO_ENGINES)
    d = after.delta(before)
    for name in asdict(d):
        assert getattr(d, name) == pytest.approx(getattr(after, name) - getattr(before, name))
    assert d.prompt_tokens_external == 1500.0 - 1088.0
    assert after.delta(after) == TransferCounters()


def test_to_dict_includes_the_total():
    d = parse_transfer_counters(TWO_ENGINES).to_dict()
    assert d["prompt_tokens_total"] == 1521.0
    assert set(asdict(TransferCounters())) < set(d)


# ---- scraping a live (local, fake) server -------------------------------------------------
class _MetricsHandler(http.server.BaseHTTPRequestHandler):
    pages: dict[str, tuple[int, str]] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        status, body = self.server.pages.get(self.path, (404, "not found"))  # type: ignore[attr-defined]
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # keep test output quiet
        pass


def _serve(pages: dict[str, tuple[int, str]]) -> tuple[http.server.HTTPServer, threading.Thread]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MetricsHandler)
    server.pages = pages  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    return server, thread


@pytest.fixture(scope="module")
def metrics_servers() -> Iterator[list[str]]:
    started = [_serve({"/metrics": (200, AFTER_PD)}), _serve({"/metrics": (200, TWO_ENGINES)}),
               _serve({"/metrics": (500, "boom")})]
    try:
        yield [f"http://127.0.0.1:{s.server_address[1]}" for s, _ in started]
    finally:
        for server, thread in started:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


def test_scrape_reads_metrics_path(metrics_servers):
    url = metrics_servers[0]
    assert scrape(url) == parse_transfer_counters(AFTER_PD)
    assert scrape(url + "/") == parse_transfer_counters(AFTER_PD)   # trailing slash tolerated


def test_scrape_all_sums_servers(metrics_servers):
    total = scrape_all(metrics_servers[:2])
    assert total.prompt_tokens_external == 1088.0 + 1500.0
    assert total.kv_transfers == 9.0
    assert scrape_all([]) == TransferCounters()


def test_scrape_raises_on_http_error(metrics_servers):
    with pytest.raises(requests.HTTPError):
        scrape(metrics_servers[2])


def test_without_a_connector_map_only_vllms_own_samples_count():
    own, nixl = metrics.parse_transfer_counters(AFTER_PD), parse_transfer_counters(AFTER_PD)
    assert own.prompt_tokens_external == nixl.prompt_tokens_external == 1088.0
    assert own.kv_bytes == 0.0 and own.kv_transfers == 0.0
