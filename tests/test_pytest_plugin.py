"""The pytest plugin, run inside pytest (pytester): options, parametrization, xdist grouping and
"no silent green". No server starts here: these tests stop before any cell runs."""
from __future__ import annotations

import pytest

from harness import matrix
from harness.ci.farm import run_farm
from harness.core.platform import PlatformInfo

pytest_plugins = ["pytester"]

SUITE = "from harness.pytest_suite import *  # noqa\n"
GPU_ONLY = """
models:
  tiny-llama-gsm: {kind: dense, family: llama, num_kv_heads: 2, head_dim: 64, max_position_embeddings: 2048}
profiles:
  gpu-only:
    description: every cell needs a GPU
    defaults: {device: cuda, backend: FLASH_ATTN, kv_buffer_device: cuda}
    grids:
      - model: tiny-llama-gsm
        block_size: [16, 64]
"""


def test_the_plugin_is_registered_by_its_entry_point(pytester):
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*pd-accuracy*", "*--pd-profile*", "*--pd-margin*"])
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["*pd_accuracy: a real P/D pair*"])


def test_cells_are_parametrized_by_id_and_grouped_by_baseline(pytester):
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("--collect-only", "-q", "--pd-profile", "smoke",
                                "--pd-platform", "cpu")
    smoke = matrix.expand(matrix.load_matrix(), "smoke", PlatformInfo()).cells
    result.stdout.fnmatch_lines([f"*test_pd_matches_baseline[[]{smoke[0].cell_id}[]]*"])
    assert result.ret == 0
    items, _ = pytester.inline_genitems("--pd-profile", "smoke", "--pd-platform", "cpu")
    groups = {item.callspec.params["pd_cell"].cell_id:
              [m.args[0] for m in item.iter_markers("xdist_group")] for item in items}
    assert len(groups) == len(smoke)
    for cell in smoke:   # one group per baseline: its cells share one worker and one baseline
        assert groups[cell.cell_id] == [cell.baseline_key]


def test_empty_parametrization_is_a_collection_error_with_the_reason(pytester):
    """A profile with no cell runnable here must not become an empty, skipped, green run."""
    pytester.makepyfile(test_suite=SUITE)
    pytester.makefile(".yaml", gpu=GPU_ONLY)
    result = pytester.runpytest("--pd-matrix", "gpu.yaml", "--pd-profile", "gpu-only",
                                "--pd-platform", "cpu")
    assert result.ret == pytest.ExitCode.INTERRUPTED   # errors during collection
    result.stdout.fnmatch_lines(["*pd-accuracy: profile 'gpu-only' has no cell that can run here "
                                 "(gpu-count: *GPU*"])
    result.stdout.no_fnmatch_line("*passed*")


def test_xdist_without_a_dist_mode_distributes_by_group(pytester):
    pytester.makeconftest("def pytest_sessionstart(session):\n"
                          "    if not hasattr(session.config, 'workerinput'):\n"
                          "        open('dist.txt', 'w').write(session.config.option.dist)\n")
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    pytester.runpytest("-n", "2").assert_outcomes(passed=1)
    assert (pytester.path / "dist.txt").read_text() == "loadgroup"
    pytester.runpytest("-n", "2", "--dist", "load").assert_outcomes(passed=1)
    assert (pytester.path / "dist.txt").read_text() == "load"     # the user's choice stands


SERVERS_ON_ONE_WORKER = """
import os, time, pytest

def _note(kind):
    with open(f"ran-{kind}-{os.environ['PYTEST_XDIST_WORKER']}", "a") as f:
        f.write("x")

@pytest.mark.slow
@pytest.mark.parametrize("i", range(4))
def test_starts_servers(i):
    time.sleep(0.4)
    _note("slow")

@pytest.mark.slow
@pytest.mark.xdist_group("its-own")
def test_starts_servers_in_its_own_group():
    time.sleep(0.4)
    _note("slow")

@pytest.mark.parametrize("i", range(6))
def test_unit(i):
    time.sleep(0.2)
    _note("unit")
"""


def _workers(path, kind):
    return {p.name.rsplit("-", 1)[1] for p in path.glob(f"ran-{kind}-*")}


def test_servers_on_one_worker_keeps_every_server_test_on_one_worker(pytester):
    pytester.makepyfile(test_mix=SERVERS_ON_ONE_WORKER)
    pytester.runpytest("-n", "2", "--pd-servers-on-one-worker").assert_outcomes(passed=11)
    [servers] = _workers(pytester.path, "slow")
    assert _workers(pytester.path, "unit") - {servers}, "no unit test ran beside the servers"
    for p in pytester.path.glob("ran-*"):
        p.unlink()
    # without the option the same tests spread over both workers: the option is what holds them
    pytester.runpytest("-n", "2").assert_outcomes(passed=11)
    assert len(_workers(pytester.path, "slow")) == 2


GROUPED = """
import os, time, pytest

@pytest.mark.xdist_group("one-baseline")
@pytest.mark.parametrize("i", range(4))
def test_cell(i):
    time.sleep(0.3)
    with open(f"ran-cell-{os.environ['PYTEST_XDIST_WORKER']}", "a") as f:
        f.write("x")

@pytest.mark.parametrize("i", range(4))
def test_other(i):
    time.sleep(0.3)
"""


@pytest.mark.parametrize("dist", [[], ["--dist", "loadgroup"]], ids=["implicit", "explicit"])
def test_a_groups_tests_run_on_one_worker(pytester, dist):
    """Where the tests ran, not only the dist mode: a worker re-parses the command line (the
    plugin's implicit loadgroup never reached it) and pytest 9.2 ignores xdist 3.8's suffix."""
    pytester.makepyfile(test_grouped=GROUPED)
    pytester.runpytest("-n", "2", *dist).assert_outcomes(passed=8)
    assert len(_workers(pytester.path, "cell")) == 1


def test_the_selected_cells_are_those_left_after_k(pytester):
    """A baseline group runs the selected cells of that group: before, the plugin read them
    before -k deselected any, so `-k "p128d128 and not fault"` also ran the group's canaries."""
    pytester.makeconftest("import json\n"
                          "def pytest_collection_finish(session):\n"
                          "    from harness.pytest_plugin import selected_cells\n"
                          "    json.dump([c.cell_id for c in selected_cells(session)],\n"
                          "              open('selected.json', 'w'))\n")
    pytester.makepyfile(test_cells="def test_cell(pd_cell):\n    pass\n")
    pytester.runpytest("--collect-only", "--pd-platform", "cpu",
                       "-k", "tiny-llama-gsm and p128d128 and not fault")
    import json
    assert json.loads((pytester.path / "selected.json").read_text()) == [
        "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager"]


def test_workers_share_the_controllers_run_id(pytester):
    pytester.makepyfile(test_suite="from harness.pytest_plugin import run_id\n\n"
                        "def test_id(request):\n"
                        "    print('RUN-ID', run_id(request.config))\n")
    result = pytester.runpytest("-n", "2", "-s", "-p", "xdist", "-rA")
    assert result.ret == 0


def test_an_empty_selection_selects_nothing():
    cells = matrix.expand(matrix.load_matrix(), "smoke", PlatformInfo()).cells
    assert matrix.select(cells, []) == []
    assert matrix.select(cells, None) == list(cells)
    with pytest.raises(ValueError, match="no cell selected"):
        run_farm("smoke", only=[], dry_run=True)


def test_the_runs_annotation_history_and_report_name_every_cell(tmp_path):
    import shutil
    from pathlib import Path

    from harness.pytest_plugin import render_run_outputs
    from harness.run.record import load_records

    source = Path(__file__).resolve().parent / "data" / "records"
    run = tmp_path / "run"
    shutil.copytree(source, run)
    assert render_run_outputs(run) == []
    assert (run / "annotation.md").exists() and (run / "report" / "index.html").exists()
    assert len({r["cell"]["id"] for r in load_records(run)}) >= 5
    assert render_run_outputs(tmp_path / "nothing-ran") == []


RECORDING_JUDGE = """
import json
import pytest

@pytest.fixture(scope="session")
def pd_judge():
    def judge(cells, then=()):
        with open("calls.jsonl", "a") as f:
            f.write(json.dumps({"run": sorted({c.baseline_key for c in cells}),
                                "then": sorted({c.baseline_key for c in then})}) + "\\n")
        return []
    return judge
"""
GROUPS_IN_TURN = """
from harness.pytest_suite import pd_groups  # noqa: F401

def test_cell(pd_cell, pd_groups):
    pd_groups.result(pd_cell)
"""


def _judge_calls(path) -> list[dict]:
    import json
    return [json.loads(line) for line in (path / "calls.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("args,known", [((), True), (("-n", "2", "--pd-servers-on-one-worker"), True),
                                        (("-n", "2"), False)])
def test_each_group_names_the_group_that_runs_next_where_it_is_known(pytester, args, known):
    """The runner starts the next group's servers during a group's last pair (on CPU), so the
    suite tells it which group comes next: where one process runs every server test in
    collection order. With groups spread over workers nobody knows: nothing is named."""
    pytester.makeconftest(RECORDING_JUDGE)
    pytester.makepyfile(test_groups=GROUPS_IN_TURN)
    pytester.runpytest("--pd-platform", "cpu", *args).assert_outcomes(passed=11)
    calls = _judge_calls(pytester.path)
    assert len(calls) == 4 and all(len(c["run"]) == 1 for c in calls)
    if known:
        assert [c["then"] for c in calls] == [c["run"] for c in calls[1:]] + [[]]
    else:
        assert all(c["then"] == [] for c in calls)


def test_pd_weather_keeps_the_profiles_cells_of_that_weather(pytester):
    pytester.makepyfile(test_suite=SUITE)
    # a subprocess: cpu-full's expansion imports numpy, which does not import twice in-process
    result = pytester.runpytest_subprocess("--collect-only", "-q", "--pd-profile", "cpu-full",
                                           "--pd-platform", "cpu", "--pd-weather", "load")
    ids = [line for line in result.stdout.lines if "test_pd_matches_baseline[" in line]
    assert ids and all("-w_load" in line for line in ids), result.stdout.lines
    result = pytester.runpytest_subprocess("--collect-only", "-q", "--pd-profile", "smoke",
                                           "--pd-platform", "cpu", "--pd-weather", "load")
    result.stdout.fnmatch_lines(["*has no cell of weather 'load' that can run here*"])
    assert result.ret != 0
