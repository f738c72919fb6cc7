"""The weather axis: the table's rows, YAML forms and their errors, expansion and ids, the rules
both ways (unknown weather, a parameter out of bounds, a connector or vLLM that cannot produce
it), the CLI's one line and exit 2, and the server changes a weather makes."""
from __future__ import annotations

import json
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from harness.connectors import KV_CONNECTORS
from harness.core.cell import Cell
from harness.core.platform import PlatformInfo, VllmFeatures
from harness.weathers import WEATHERS, resolved_params, weather_problem
from harness.weathers.facts import ServerChanges, WeatherRow
from harness.matrix import MatrixError, expand, load_matrix
from harness.matrix.rules import check_cell
from harness.run.weather import drivers, weather_for
from harness.run.weather.base import Weather
from harness.serve.launch.server_spec import ServerSpec, build_argv, build_env

CPU = PlatformInfo()
CATALOG = load_matrix().models
CELL = Cell(model="tiny-llama-gsm")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_every_row_has_a_driver_and_every_driver_a_row(monkeypatch):
    assert set(drivers()) == set(WEATHERS)
    monkeypatch.setitem(WEATHERS, "undriven", WeatherRow())
    with pytest.raises(KeyError, match="has a row but no package"):
        weather_for("undriven")


@pytest.mark.parametrize("name", sorted(WEATHERS))
def test_every_row_has_a_driver_of_that_name(name):
    weather = weather_for(name)
    assert isinstance(weather, Weather) and weather.name == name
    params = resolved_params(name, {})
    for role, changes in weather.servers(CELL.replace(weather=name), params).items():
        assert role in ("prefill", "decode") and isinstance(changes, ServerChanges)


def test_calm_is_absent_from_the_id_and_the_baseline_key():
    load = CELL.replace(weather="load")
    assert CELL.cell_id == "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1"
    assert load.cell_id == CELL.cell_id + "-w_load"
    assert load.replace(weather_params=(("in_flight", 96),)).cell_id.endswith("-w_load_in_flight96")
    assert load.baseline_key == CELL.baseline_key        # the baseline runs calm
    assert Cell.from_dict(load.to_dict()) == load
    canary = load.replace(fault="drop-transfer")
    assert canary.cell_id.endswith("-w_load-fault-drop-transfer")   # the fault stays last


def test_yaml_weather_and_params_expand(tmp_path):
    spec = load_matrix(write(tmp_path, """
        models: {d: {kind: dense}}
        profiles:
          p:
            grids:
              - model: d
                weather: [calm, load]
              - model: d
                weather: load
                weather_params: [{in_flight: 96}, {in_flight: 64, kv_blocks: 32}]
    """))
    ids = set(expand(spec, "p", CPU).by_id())
    base = "v1-CPU_ATTN-p128d128-d-tp1x1"
    assert {base, base + "-w_load", base + "-w_load_in_flight96",
            base + "-w_load_in_flight64_kv_blocks32"} <= ids


@pytest.mark.parametrize("text, message", [
    ("weather: 3", "weather"),
    ("weather_params: {in_flight: fast}", "weather"),
])
def test_yaml_bad_forms_are_one_line(tmp_path, text, message):
    with pytest.raises(MatrixError, match=message) as info:
        load_matrix(write(tmp_path, f"""
            models: {{d: {{kind: dense}}}}
            profiles:
              p:
                grids:
                  - model: d
                    {text}
        """))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("weather, params, expected", [
    ("storm", {}, "unknown weather 'storm'; use one of calm, load"),
    ("load", {"share": 0.5}, "weather load takes no parameter 'share'"),
    ("load", {"in_flight": 16}, "in_flight must be 64–512, got 16"),
    ("load", {"in_flight": 64.5}, "in_flight must be a whole number"),
    ("load", {"in_flight": True}, "in_flight must be a number"),
])
def test_weather_problems(weather, params, expected):
    assert expected in weather_problem(weather, params)


def test_a_share_outside_0_1_is_refused(monkeypatch):
    from harness import weathers
    from harness.weathers import facts

    row = WeatherRow(params={"share": facts.WeatherParam(0.25, **facts.SHARE)})
    monkeypatch.setitem(weathers.WEATHERS, "gusty", row)
    assert weather_problem("gusty", {"share": 0.25}) is None
    assert "share must be 0–1, got 1.5" in weather_problem("gusty", {"share": 1.5})
    assert "share must be 0–1, got -0.1" in weather_problem("gusty", {"share": -0.1})


def test_rules_both_ways(monkeypatch):
    from harness import weathers

    assert not [p for p in check_cell(CELL.replace(weather="load"), CPU, CATALOG) if p.kind == "invalid"]
    bad = check_cell(CELL.replace(weather="load", weather_params=(("in_flight", 2),)), CPU, CATALOG)
    assert [p.rule for p in bad if p.kind == "invalid"] == ["known-weather"]
    # a weather that needs its connector runs with the connectors whose row lists it
    monkeypatch.setitem(weathers.WEATHERS, "pull-only",
                        WeatherRow(needs_connector=True))
    monkeypatch.setitem(KV_CONNECTORS, "nixl", replace(KV_CONNECTORS["nixl"],
                                                       weathers=("pull-only",)))
    assert not [p for p in check_cell(CELL.replace(weather="pull-only"), CPU, CATALOG)
                if p.kind == "invalid"]
    push = check_cell(CELL.replace(weather="pull-only", kv_connector="nixl-push"), CPU, CATALOG)
    assert any(p.rule == "known-weather" and "cannot be produced with kv_connector nixl-push"
               in p.message for p in push)
    monkeypatch.setitem(weathers.WEATHERS, "new", WeatherRow(min_vllm="0.40"))
    features = VllmFeatures(version="0.32.0", platform="cpu", attention_backend_flag=True,
                            attention_backend_env=True, v2_runner_env=True,
                            kv_roles=("kv_producer", "kv_consumer"))
    old = replace(CPU, vllm=features)
    problems = check_cell(CELL.replace(weather="new"), old, CATALOG)
    assert any(p.rule == "vllm-weather" and "needs vLLM >= 0.40" in p.message for p in problems)
    assert not any(p.rule == "vllm-weather" for p in check_cell(CELL.replace(weather="load"), old, CATALOG))


def test_cli_weather_bad_input_is_one_line_exit_2(capsys):
    from harness.cli.main import main

    for argv in (["--weather", "storm"], ["--weather", "load", "--weather-param", "in_flight=8"],
                 ["--weather", "load", "--weather-param", "in_flight"]):
        assert main(["run", "--model", "tiny-llama-gsm", "--dry-run", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and ("weather" in err), err


def test_server_changes_reach_argv_env_and_kv_transfer_config():
    changes = ServerChanges(extra_args=("--foo",), extra_env=(("PD_ACCURACY_X", "1"),),
                            kv_transfer=(("kv_load_failure_policy", "fail"),),
                            kv_connector_extra=(("lease", 2),), num_blocks=48,
                            prefix_caching=True, max_num_seqs=96)
    spec = ServerSpec(role="decode", index=0, model_path="/m", served_model_name="m", port=1,
                      backend="CPU_ATTN", block_size=128, weather=changes)
    argv = build_argv(spec)
    ktc = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert ktc["kv_load_failure_policy"] == "fail" and ktc["kv_connector_extra_config"] == {"lease": 2}
    joined = " ".join(argv)
    assert "--num-gpu-blocks-override 48" in joined and "--enable-prefix-caching" in joined
    assert "--max-num-seqs 96" in joined and argv[-1] == "--foo"
    assert build_env(spec, base_env={})["PD_ACCURACY_X"] == "1"
    calm = replace(spec, weather=ServerChanges())
    assert "--num-gpu-blocks-override" not in build_argv(calm)


def test_the_baseline_never_gets_weather():
    from harness.weathers.facts import ServerChanges
    from harness.serve.deploy import DeployContext, plan_server
    from harness.serve.host.ports import PortAllocator
    from harness.serve.launch.placement import Placement

    ctx = DeployContext(allocator=PortAllocator(lock_dir="/tmp"), placement=Placement(),
                        log_dir=Path("/tmp"))
    changes = ServerChanges(num_blocks=8)
    base = plan_server(CELL, "baseline", 0, ctx, model_path="/m", hybrid=False, port=1,
                       side_channel_port=None, weather=changes)
    decode = plan_server(CELL, "decode", 0, ctx, model_path="/m", hybrid=False, port=2,
                         side_channel_port=None, weather=changes)
    assert not base.weather and decode.weather.num_blocks == 8


def test_a_weather_cache_must_hold_one_request_of_max_model_len():
    ok = check_cell(CELL.replace(weather="preemption"), CPU, CATALOG)
    assert not [p for p in ok if p.kind == "invalid"]
    small = CELL.replace(weather="preemption", weather_params=(("decode_kv_blocks", 8),))
    problems = [p for p in check_cell(small, CPU, CATALOG) if p.kind == "invalid"]
    assert [p.rule for p in problems] == ["known-weather"]
    assert ("decode_kv_blocks=8 blocks of 128 tokens hold 1024, less than one request of "
            "max_model_len 2048 on the decode") in problems[0].message
    shorter = small.replace(max_model_len=1024)
    assert not [p for p in check_cell(shorter, CPU, CATALOG) if p.kind == "invalid"]
