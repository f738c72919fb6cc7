"""Adding a weather is a package: a made-up one from a test package (tests/data/fake_weather, no
harness file changed) registered beside a made-up connector is a weather the matrix knows (its
parameter, its own rule, the connectors it runs with), the run drives (its servers' changes, its
counters through the cell's connector), the compatibility table lists (its hook), the decode's
faults plugin arms (its in-server fault) and the proxy routes (its hops)."""
from __future__ import annotations

import asyncio

import pytest

from harness import connectors, weathers
from harness.core.cell import Cell
from harness.core.platform import PlatformInfo
from harness.core.vllm_hooks import hooks
from harness.matrix import load_matrix
from harness.matrix.rules import check_cell, describe_rules
from harness.run.plan.group_plan import weather_servers
from harness.run.weather import weather_for
from harness.run.weather.base import WeatherRun
from harness.serve.launch.hook_plugins import hook_plugins
from harness.serve.plugins.faults import decode
from harness.serve.proxy.app import weather_hops
from harness.weathers import resolved_params
from tests.data import fake_connector, fake_weather
from tests.data.fake_weather import driver as fake_driver
from tests.data.fake_weather import in_server as fake_in_server
from tests.serve.test_proxy import pair, proxied

CPU = PlatformInfo()
CATALOG = load_matrix().models
CELL = Cell(model="tiny-llama-gsm", compile="eager", weather="drizzle",
            kv_connector=fake_connector.VALUE)


@pytest.fixture
def drizzle():
    connectors.register(fake_connector)
    weathers.register(fake_weather)
    yield
    weathers.unregister(fake_weather)
    connectors.unregister(fake_connector)


def invalid(cell: Cell) -> dict[str, str]:
    return {p.rule: p.message for p in check_cell(cell, CPU, CATALOG) if p.kind == "invalid"}


def test_registering_adds_its_row_driver_and_hook(drizzle):
    assert list(weathers.WEATHERS)[-1] == "drizzle"
    assert weather_for("drizzle") is fake_driver.WEATHER
    assert "drizzle-hook" in [h.name for h in hooks()]
    assert hook_plugins()["drizzle-hook"] == "tests.data.fake_weather.in_server"
    assert CELL.replace(weather_params=(("share", 0.25),)).cell_id.endswith("w_drizzle_share0.25")


def test_unregistering_takes_it_back():
    weathers.register(fake_weather)
    weathers.unregister(fake_weather)
    assert "drizzle" not in weathers.WEATHERS
    assert "drizzle-hook" not in [h.name for h in hooks()]
    assert "drizzle-blocks" not in [name for name, _, _ in describe_rules()]
    assert "unknown weather 'drizzle'" in invalid(CELL)["known-weather"]


def test_the_rules_know_its_parameter_connectors_and_own_rule(drizzle):
    assert invalid(CELL) == {}
    assert "share must be 0–1" in invalid(CELL.replace(weather_params=(("share", 2),)))[
        "known-weather"]
    on_nixl = invalid(CELL.replace(kv_connector="nixl"))["known-weather"]
    assert on_nixl.endswith("cannot be produced with kv_connector nixl; it runs with made-up")
    assert invalid(CELL.replace(prefill_block_size=64, decode_block_size=128)) == {
        "drizzle-blocks": "weather drizzle needs equal block sizes"}
    names = [name for name, _, _ in describe_rules()]
    assert names[names.index("known-weather"):][:3] == ["known-weather", "boundary-blocks",
                                                        "drizzle-blocks"]


def test_its_servers_and_counters_follow_the_cells_connector(drizzle, tmp_path):
    assert {role: dict(c.extra_env) for role, c in weather_servers(CELL).items()} == {
        "decode": {"DRIZZLE_SHARE": "0.5"}}

    def run(cell: Cell, metrics_after) -> WeatherRun:
        return WeatherRun(cell=cell, params=resolved_params("drizzle", {}), rows=(),
                          proxy_records=(), metrics_before={}, metrics_after=metrics_after)

    counted = {"prefill-0": {"vllm:madeup_failed_total": 2,
                             "vllm:nixl_num_failed_transfers_total": 5}, "decode-0": {}}
    [made_up] = weather_for("drizzle").conditions(run(CELL, counted))
    assert made_up.passed and made_up.detail == "prefill vllm:madeup_failed_total: 2"
    [nixl] = weather_for("drizzle").conditions(run(CELL.replace(kv_connector="nixl"), counted))
    assert not nixl.passed and nixl.detail.startswith("decode vllm:nixl_num_failed_transfers")


def test_the_faults_plugin_arms_its_fault_under_by_request(drizzle, monkeypatch):
    from harness.weathers.expiry import in_server as expiry_fault

    armed: list[str] = []
    for module, name in ((decode, "arm"), (decode.fail_transfer, "arm"),
                         (decode.early_release, "arm"), (expiry_fault, "arm")):
        monkeypatch.setattr(module, name, lambda *a, _m=module.__name__: armed.append(_m))
    monkeypatch.setattr(fake_in_server, "ARMED", [])
    monkeypatch.setenv("PD_ACCURACY_FAULT", "by-request")
    monkeypatch.setattr(decode.register, "done", False)
    decode.register()
    assert fake_in_server.ARMED == [True] and "harness.weathers.expiry.in_server" in armed


def test_the_proxy_routes_its_tagged_requests_to_its_hops(drizzle):
    assert "tests.data.fake_weather.proxy" in [m.__name__ for m in weather_hops()]

    async def scenario():
        prefill, decode_server = pair([])
        async with proxied([prefill], [decode_server], request_tag=fake_driver.TAG) as client:
            answers = [await client.post("/v1/completions",
                                         json={"model": "m", "prompt": f"q{i}", "max_tokens": 4})
                       for i in range(2)]
            records = await (await client.get("/pd/records")).json()
        return [a.status for a in answers], records, prefill, decode_server

    statuses, records, prefill, decode_server = asyncio.run(scenario())
    assert statuses == [418, 418]
    assert [r["drizzled"] for r in records] == ["drop 0", "drop 1"]
    assert (len(prefill.requests), len(decode_server.requests)) == (2, 0)
