"""Adding a connector is a package: a made-up one from a test package (tests/data/fake_connector,
no harness file changed) registered, with other capabilities than NIXL's, changes the matrix
rules' outcomes, what the weathers set and count, provenance, the verdict's words and what the
servers' connector interface finds for its class."""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from harness import connectors
from harness.connectors import connector_for, connector_row
from harness.core.cell import Cell
from harness.core.platform import PlatformInfo
from harness.weathers import resolved_params
from harness.judge.kv_digest_check import entered
from harness.matrix import load_matrix
from harness.matrix.rules import check_cell
from harness.weathers.expiry.protocol import HELD_PREFIX
from harness.run.evidence.provenance import versions
from harness.run.weather import weather_for
from harness.run.weather.base import WeatherRun
from harness.serve.plugins.kv_events import interface
from harness.serve.proxy.hops import new_request_id
from tests.data import fake_connector
from tests.data.fake_connector import VALUE

CPU = PlatformInfo()
CATALOG = load_matrix().models


@pytest.fixture
def made_up():
    connectors.register(fake_connector)
    yield
    connectors.unregister(fake_connector)


def test_registering_adds_its_rows_driver_and_in_server_part(made_up):
    assert connectors.packages()[-1] is fake_connector
    assert list(connectors.KV_CONNECTORS)[-1] == VALUE
    assert connector_for(VALUE) is fake_connector.DRIVERS[0]
    assert interface.specifics_for(type("MadeUpConnector", (), {})).__name__ == (
        "tests.data.fake_connector.in_server")
    assert "MADE_UP_SIDE_PORT" in interface.per_server_env()
    assert "made-up lease over" in connectors.log_patterns("lease_expired")


def test_unregistering_takes_it_back():
    connectors.register(fake_connector)
    connectors.unregister(fake_connector)
    assert VALUE not in connectors.KV_CONNECTORS
    assert interface.specifics_for(type("MadeUpConnector", (), {})) is None
    assert "made-up" not in (connectors.log_patterns("lease_expired") or "")


def test_an_installed_distributions_entry_point_is_a_package_too(monkeypatch):
    entry = type("Entry", (), {"load": staticmethod(lambda: fake_connector)})()
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [entry] if group == connectors.ENTRY_POINTS else [])
    connectors._REGISTRATION.fill()
    try:
        assert connector_row(VALUE).word == "MadeUp"
    finally:
        monkeypatch.undo()
        connectors._REGISTRATION.fill()
    assert VALUE not in connectors.KV_CONNECTORS


def problems(cell: Cell) -> dict[str, object]:
    return {p.rule: p for p in check_cell(cell, CPU, CATALOG)}


CELL = Cell(model="tiny-llama-gsm", compile="eager")


def test_rules_follow_the_row(made_up):
    # block sizes: NIXL takes p64 -> d128 only; the made-up row takes any pair
    shrink = dict(prefill_block_size=128, decode_block_size=64)
    assert "heterogeneous-block-divisible" in problems(CELL.replace(**shrink))
    assert "heterogeneous-block-divisible" not in problems(CELL.replace(kv_connector=VALUE, **shrink))
    # a mixed-dtype pair is expected to end in the connector's own refusal
    mixed = dict(prefill_kv_cache_dtype="auto", decode_kv_cache_dtype="fp8")
    nixl = problems(CELL.replace(**mixed))["kv-cache-dtype-mismatch"]
    ours = problems(CELL.replace(kv_connector=VALUE, **mixed))["kv-cache-dtype-mismatch"]
    assert "NIXL compatibility hash mismatch" in nixl.fails_with
    assert ours.fails_with == "dtypes differ, made-up"
    assert "dtypes differ, made-up" in ours.message and "NIXL" not in ours.message
    # weathers: the row lists expiry, not aborts (NIXL pull lists both)
    assert "known-weather" not in problems(CELL.replace(kv_connector=VALUE, weather="expiry"))
    refused = problems(CELL.replace(kv_connector=VALUE, weather="aborts"))["known-weather"]
    assert "cannot be produced with kv_connector made-up" in refused.message
    assert "known-weather" not in problems(CELL.replace(weather="aborts"))


def weather_run(cell: Cell, tmp_path: Path, *, metrics_after, decode_log="", prefill_log="",
                records=()) -> WeatherRun:
    logs = {}
    for name, text in (("decode-0", decode_log), ("prefill-0", prefill_log)):
        (tmp_path / f"{name}.log").write_text(text)
        logs[name] = str(tmp_path / f"{name}.log")
    return WeatherRun(cell=cell, params=resolved_params(cell.weather, cell.weather_settings),
                      rows=(), proxy_records=tuple(records), metrics_before={},
                      metrics_after=metrics_after, logs=logs)


def passed(name: str, run: WeatherRun) -> dict[str, bool]:
    return {c.name: c.passed for c in weather_for(name).conditions(run)}


def test_expiry_sets_the_rows_lease_and_reads_its_log_and_counter(made_up, tmp_path):
    cell = CELL.replace(kv_connector=VALUE, weather="expiry")
    params = resolved_params("expiry", cell.weather_settings)
    servers = weather_for("expiry").servers(cell, params)
    assert dict(servers["prefill"].kv_connector_extra) == {"madeup_lease_seconds": 2}
    tag = weather_for("expiry").workload(cell, params).request_tag.partition("@")[0]
    late = [new_request_id(tag) for _ in range(2)]
    held = "\n".join(f"WARNING {HELD_PREFIX} held request=cmpl-{r}-0-ab delay_ms=4000 "
                     f"heartbeat=stopped" for r in late)
    released = "\n".join(f"made-up lease over for cmpl-{r}-0-9c" for r in late)
    records = [{"request_id": r, "decode_status": 200} for r in late]
    # counted on the decode (the row's map), not where NIXL counts it (the prefill)
    on_decode = weather_run(cell, tmp_path, records=records, decode_log=held,
                            prefill_log=released,
                            metrics_after={"decode-0": {"vllm:madeup_expired_total": 2},
                                           "prefill-0": {}})
    assert passed("expiry", on_decode) == {"reads-held": True, "delayed-expired": True,
                                           "expired-count": True}
    on_prefill = weather_run(cell, tmp_path, records=records, decode_log=held,
                             prefill_log=released,
                             metrics_after={"prefill-0": {"vllm:madeup_expired_total": 2},
                                            "decode-0": {}})
    assert passed("expiry", on_prefill)["expired-count"] is False
    # NIXL's log line means nothing to it
    nixl_words = "\n".join(f"Releasing expired KV blocks for request cmpl-{r}-0-9c" for r in late)
    unread = weather_run(cell, tmp_path, records=records, decode_log=held, prefill_log=nixl_words,
                         metrics_after={"decode-0": {"vllm:madeup_expired_total": 2}})
    assert passed("expiry", unread)["delayed-expired"] is False


def test_load_failures_counts_on_the_rows_role(made_up, tmp_path):
    cell = CELL.replace(kv_connector=VALUE, weather="load-failures")
    run = weather_run(cell, tmp_path, metrics_after={"prefill-0": {"vllm:madeup_failed_total": 3},
                                                     "decode-0": {"vllm:madeup_failed_total": 9}})
    assert run.counter_delta("failed_transfers") == 3
    assert run.counter_source("failed_transfers") == "prefill vllm:madeup_failed_total"
    nixl = weather_run(CELL.replace(weather="load-failures"), tmp_path, metrics_after={
        "prefill-0": {"vllm:nixl_num_failed_transfers_total": 3},
        "decode-0": {"vllm:nixl_num_failed_transfers_total": 9}})
    assert nixl.counter_delta("failed_transfers") == 9


def test_provenance_and_verdict_words_are_the_rows(made_up):
    assert "made_up_transfer" in versions(VALUE) and "nixl" not in versions(VALUE)
    assert connector_row(VALUE).word == "MadeUp"
    said = entered({"connector": connector_row(VALUE).word}, {"raw": {}})
    assert said.startswith("entered after the transfer: MadeUp wrote the bytes")
