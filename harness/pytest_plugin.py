"""pytest plugin (entry point `pytest11: pd_accuracy`): the `pd_accuracy` marker, the `--pd-*`
options, matrix parametrization of `pd_cell`, and fixtures a downstream test can use.

Hooks and fixtures only; the tests that judge a profile's cells live in harness.pytest_suite
(a test file imports them). Importing this module imports nothing heavy: vLLM users get it in
every pytest run of an environment where pd-accuracy is installed.

Fixtures:
  pd_cell                 one cell of `--pd-profile` (parametrized; pytest -k selects by cell id)
  pd_options, pd_policy   the run's RunOptions / Policy, built from the --pd-* options and
                          --pd-run-arg exactly as `pd-accuracy run` builds them
  pd_runner               the session's Runner (one results directory per run, shared by
                          pytest-xdist workers)
  pd_judge                pd_judge(cell_or_cells) -> CellResult(s): start, evaluate, judge
  pd_baseline             context manager: pd_baseline(cell) -> running baseline Endpoint
  pd_pair                 context manager: pd_pair(cell) -> running P/D pair behind the proxy
"""
from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from harness.core.cell import Cell

RUN_ID_KEY = "pd_accuracy_run_id"
LOADGROUP_KEY = "pd_accuracy_loadgroup"


def pytest_addoption(parser: pytest.Parser) -> None:
    from harness.connectors import driven_connectors
    from harness.weathers import WEATHERS

    g = parser.getgroup("pd-accuracy")
    g.addoption("--pd-profile", default="smoke", help="matrix profile to parametrize (default smoke)")
    g.addoption("--pd-matrix", default=None,
                help="matrix YAML (default: the packaged harness/matrix/default.yaml); a user "
                     "matrix may `extends:` the default one")
    g.addoption("--pd-results-dir", default="results/runs", help="where records are written")
    # values are checked with `pd-accuracy run`'s own types in pytest_configure (one line, exit 2)
    g.addoption("--pd-limit", default=None, help="questions per cell (default: 50)")
    g.addoption("--pd-alpha", default=None, help="significance level (default 0.01)")
    g.addoption("--pd-margin", default=None,
                help="PASS: P/D is not worse than the baseline by more than this many points "
                     "(default 5)")
    g.addoption("--pd-max-questions", default=None,
                help="question budget per cell for undecided cells (default 400)")
    g.addoption("--pd-farm", action="store_true",
                help="run each baseline group's cells as the generated Buildkite steps "
                     "(`pd-accuracy farm`, subprocesses) instead of in this process")
    g.addoption("--pd-run-arg", action="append", default=[],
                help="extra `pd-accuracy run` argument (repeatable), e.g. --pd-run-arg=--num-fewshot=1; "
                     "used in both modes")
    g.addoption("--pd-kv-connector", default=None, metavar="VALUE",
                help="only the profile's cells of this KV connector (harness.connectors: "
                     f"{', '.join(driven_connectors()[:2])}, ...); with pd_judge/pd_pair, "
                     "Cell(kv_connector=...)")
    g.addoption("--pd-weather", default=None, metavar="VALUE",
                help="only the profile's cells of this weather (harness.weathers: "
                     f"{', '.join(list(WEATHERS)[:2])}, ...); with pd_judge/pd_pair, "
                     "Cell(weather=...)")
    g.addoption("--pd-platform", default=None,
                help="expand for this platform instead of this machine (cpu, cuda:N)")
    g.addoption("--pd-servers-on-one-worker", action="store_true",
                help="with pytest-xdist: every test that starts servers (the matrix cells and "
                     "tests marked slow) runs on one worker, one after another, and the other "
                     "workers take the rest; for a small machine, where servers must not "
                     "compete with servers but unit tests fit in the cores they leave idle")


# --pd-* option -> the `pd-accuracy run` option it stands for
RUN_OPTIONS = (("--pd-limit", "--limit"), ("--pd-alpha", "--alpha"), ("--pd-margin", "--margin"),
               ("--pd-max-questions", "--max-questions"))
PD_DEFAULTS = {"pd_profile": "smoke", "pd_matrix": None, "pd_results_dir": "results/runs",
               "pd_kv_connector": None, "pd_weather": None, "pd_platform": None, "pd_run_arg": []}


def option_problem(config: pytest.Config) -> str | None:
    """The first problem of the --pd-* options and the variables the run reads, checked as
    `pd-accuracy run` checks them (harness.cli.front_door); None: all fine. The matrix and the
    environment are read here only when a --pd-* option was given (vLLM's own test runs load
    this plugin too, and pay nothing for it), else when the matrix cells are collected."""
    from harness.cli import inputs
    from harness.cli.front_door import EVALUATION_OPTIONS, SERVER_OPTIONS
    from harness.core.options import UsageError

    get = config.getoption
    try:
        argv = [x for opt, flag in RUN_OPTIONS if get(opt) is not None for x in (flag, get(opt))]
        args = _run_args(argv + list(get("--pd-run-arg")) + ["--results-dir",
                                                            get("--pd-results-dir")])
        _check_values(config)
        if any(get(k) != v for k, v in PD_DEFAULTS.items()) or argv:
            problems = inputs.env_problems("pytest")
            if problems:
                return inputs.one_line(problems)
            from harness import matrix
            matrix.load_matrix(get("--pd-matrix")).profile(get("--pd-profile"))
        run_wide = EVALUATION_OPTIONS + SERVER_OPTIONS
        extra = [d for d in _run_args(list(get("--pd-run-arg"))).given if d not in run_wide]
        if extra:
            return (f"--pd-run-arg {', '.join(args.given.get(d, d) for d in extra)}: the plugin "
                    f"takes run-wide options (evaluation, servers) there; its cells come from "
                    f"--pd-profile, -k, --pd-kv-connector and --pd-weather, its records go to "
                    f"--pd-results-dir")
    except (UsageError, ValueError) as exc:
        return " ".join(str(exc).split())
    return None


def _run_args(argv: list[str]):
    """`pd-accuracy run`'s parse of `argv`; a bad value is a UsageError (one line)."""
    from harness.cli.vocabulary import run_parser
    from harness.core.options import UsageError

    parser = run_parser()

    def refuse(message: str):
        raise UsageError(" ".join(message.split()))
    parser.error = refuse   # type: ignore[method-assign]
    return parser.parse_args(argv)


def _check_values(config: pytest.Config) -> None:
    from harness.cli import values as v
    from harness.connectors import KV_CONNECTORS
    from harness.weathers import WEATHERS

    for option, kind in (("--pd-platform", v.platform()),
                         ("--pd-kv-connector", v.choice(tuple(KV_CONNECTORS), "kv connector")),
                         ("--pd-weather", v.choice(tuple(WEATHERS), "weather")),
                         ("--pd-profile", v.text("--pd-profile", 200)),
                         ("--pd-matrix", v.existing("file", "--pd-matrix")),
                         ("--pd-results-dir", v.writable("dir", "--pd-results-dir"))):
        value = config.getoption(option)
        if value is not None:
            try:
                kind(value)
            except Exception as exc:   # argparse.ArgumentTypeError: the reason, one line
                raise ValueError(f"{option}: {exc}") from None


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):   # the controller checks once, before any worker
        problem = option_problem(config)
        if problem:
            pytest.exit(f"pd-accuracy: error: {problem}", returncode=2)
    config.addinivalue_line(
        "markers", "pd_accuracy: a real P/D pair against a real baseline (starts vLLM servers)")
    config.addinivalue_line("markers", "slow: starts real processes; takes more than a few seconds")
    config.addinivalue_line(
        "markers", "extended: a real multi-process scenario beyond the smoke matrix (an external "
                   "deployment, two hosts in network namespaces); `./pd test` deselects it unless "
                   "PD_ACCURACY_EXTENDED=1 (the nightly step), and pytest's summary counts it")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and RUN_ID_KEY in workerinput:
        config.stash[_RUN_ID] = workerinput[RUN_ID_KEY]
    else:
        config.stash[_RUN_ID] = (time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-"
                                 + uuid.uuid4().hex[:6])


_RUN_ID = pytest.StashKey[str]()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto` on a GPU machine: one worker per baseline group that the GPU packer
    (harness.run.plan.packing, as `pd-accuracy run` plans) lets run at once for --pd-profile, by the
    GPUs' free memory and the cores; elsewhere xdist's own count (None)."""
    from harness.core.platform import detect_gpus

    if not detect_gpus():
        return None
    return gpu_workers(config)


def gpu_workers(config: pytest.Config) -> int:
    """The packer's groups at once for this session's profile on this machine's GPUs."""
    import os

    from harness import matrix
    from harness.run.plan.packed import kv_cache_bytes, weight_bytes
    from harness.core.options import RunOptions
    from harness.core.platform import PlatformInfo, detect_gpus, query_gpu_used_bytes
    from harness.run.plan.packing import (group_jobs, groups_at_once, max_parallel_groups,
                                          read_gpu_rooms)

    devices = detect_gpus()
    cells = matrix.expand(matrix.load_matrix(config.getoption("pd_matrix")),
                          config.getoption("pd_profile"), PlatformInfo.from_devices(devices)).cells
    options = RunOptions()
    jobs = group_jobs([c for c in cells if c.device == "cuda"],
                      kv_cache_bytes=lambda c: kv_cache_bytes(c, options), weight_bytes=weight_bytes)
    rooms = read_gpu_rooms(devices, query_gpu_used_bytes())
    return groups_at_once(jobs, rooms, max_parallel_groups(os.cpu_count() or 1, len(devices)))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: every worker writes into the same run directory, and knows whether
    tests are distributed by group."""
    node.workerinput[RUN_ID_KEY] = node.config.stash[_RUN_ID]
    node.workerinput[LOADGROUP_KEY] = node.config.getoption("dist", None) == "loadgroup"


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """With pytest-xdist (`-n N`) and no --dist given, distribute by group: cells that share a
    baseline carry one `xdist_group` and so run on one worker, which starts that baseline once.
    (xdist turns an absent --dist into "load"; its scheduler reads the option later.)"""
    args = [str(a) for a in config.invocation_params.args]
    explicit = any(a == "--dist" or a.startswith("--dist=") or a == "-d" for a in args)
    if (getattr(config.option, "numprocesses", None) and not explicit
            and getattr(config.option, "dist", None) in ("no", "load")):
        config.option.dist = "loadgroup"


SERVERS_GROUP = "pd-servers"


def starts_servers(item: pytest.Item) -> bool:
    """A matrix cell, or a test marked slow ("starts real processes")."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return "pd_cell" in params or item.get_closest_marker("slow") is not None


def pytest_itemcollected(item: pytest.Item) -> None:
    """--pd-servers-on-one-worker: one xdist group for every test that starts servers. It
    replaces the test's own group (a cell's is its baseline's: xdist would join the names); the
    cells still share their baselines, since one worker runs them all. A group set on a class
    or module is left alone."""
    if item.config.getoption("--pd-servers-on-one-worker") and starts_servers(item):
        item.own_markers[:] = [m for m in item.own_markers if m.name != "xdist_group"]
        item.add_marker(pytest.mark.xdist_group(SERVERS_GROUP))


def runs_every_server_test(config: pytest.Config) -> bool:
    """Whether this process runs every selected test that starts servers, in collection order:
    no xdist worker, or a worker under --pd-servers-on-one-worker."""
    return (not hasattr(config, "workerinput")
            or bool(config.getoption("--pd-servers-on-one-worker")))


def groups_by_xdist_group(config: pytest.Config) -> bool:
    """An xdist worker whose controller distributes by xdist_group (`--dist loadgroup`, given
    or set by this plugin's pytest_cmdline_main): the controller says so in pytest_configure_node."""
    return bool(getattr(config, "workerinput", {}).get(LOADGROUP_KEY))


def suffix_xdist_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give each test with an xdist_group mark the "@group" suffix that the controller's
    loadgroup scheduler reads. xdist 3.8's worker does it only when `--dist loadgroup` is on
    its own command line (a worker re-parses the arguments, so the plugin's implicit loadgroup
    never reached it), and on pytest >= 9.2 it writes the legacy `item._nodeid`, which pytest no
    longer reads (pytest-xdist#1386; fix pending in #1388). Either way every group was spread
    over the workers, and each worker started the same baseline. Written into the id pytest
    reads; a test already suffixed is left alone."""
    if not groups_by_xdist_group(config):
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if not names or item.nodeid.endswith(suffix):
            continue
        if hasattr(item, "_id"):                       # pytest >= 9.2: structured ids
            from _pytest.nodeid import NodeId
            item._id = NodeId.parse(item.nodeid + suffix)
        else:
            item._nodeid = item.nodeid + suffix


def run_id(config: pytest.Config) -> str:
    return config.stash[_RUN_ID]


def expansion(config: pytest.Config):
    from harness import matrix
    from harness.core.platform import PlatformInfo
    from harness.serve.launch.vllm_features import detect_platform

    from harness.cli.inputs import env_problems, one_line

    problems = env_problems("pytest")   # before a cell's server could read them
    if problems:
        pytest.exit(f"pd-accuracy: error: {one_line(problems)}", returncode=2)
    try:
        spec = matrix.load_matrix(config.getoption("--pd-matrix"))
        plat = config.getoption("--pd-platform")
        platform = PlatformInfo.from_spec(plat) if plat else detect_platform()
        return spec, matrix.expand(spec, config.getoption("--pd-profile"), platform)
    except ValueError as exc:   # a matrix or profile problem: one line, as `pd-accuracy run`
        pytest.exit(f"pd-accuracy: error: {' '.join(str(exc).split())}", returncode=2)


def no_cells_reason(profile: str, excluded) -> str:
    """Why a profile expanded to no runnable cell here: the distinct exclusion reasons."""
    reasons = sorted({f"{e.rule}: {e.reason}" for e in excluded})
    shown = "; ".join(reasons[:5]) + (f"; (+{len(reasons) - 5} more)" if len(reasons) > 5 else "")
    return (f"pd-accuracy: profile {profile!r} has no cell that can run here"
            + (f" ({shown})" if shown else " (it declares none)"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "pd_cell" not in metafunc.fixturenames:
        return
    _, exp = expansion(metafunc.config)
    connector = metafunc.config.getoption("--pd-kv-connector")
    weather = metafunc.config.getoption("--pd-weather")
    cells = [c for c in exp.cells if (connector is None or c.kv_connector == connector)
             and (weather is None or c.weather == weather)]
    if not cells:
        # never an empty parametrization: pytest would skip it and a broken install looks green
        reason = no_cells_reason(metafunc.config.getoption("--pd-profile"), exp.excluded)
        if exp.cells:
            wanted = " and ".join(f"{axis} {value!r}" for axis, value in
                                  (("kv_connector", connector), ("weather", weather)) if value)
            reason = (f"pd-accuracy: profile {metafunc.config.getoption('--pd-profile')!r} has no "
                      f"cell of {wanted} that can run here")
        raise pytest.Collector.CollectError(reason)
    metafunc.parametrize("pd_cell", [
        pytest.param(c, id=c.cell_id, marks=[pytest.mark.xdist_group(c.baseline_key)])
        for c in cells])


@pytest.hookimpl(trylast=True)   # after -k/-m deselection, and after xdist's own suffixing
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    suffix_xdist_groups(config, items)
    session.stash[_SELECTED] = [i.callspec.params["pd_cell"] for i in items
                                if hasattr(i, "callspec") and "pd_cell" in i.callspec.params]


_SELECTED = pytest.StashKey[list]()


def selected_cells(session: pytest.Session) -> list["Cell"]:
    """The cells of the selected (not deselected) tests, in collection order, each once."""
    return list(dict.fromkeys(session.stash.get(_SELECTED, [])))


# ---- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def pd_run_argv(pytestconfig: pytest.Config) -> list[str]:
    """The `pd-accuracy run` arguments the --pd-* options stand for."""
    argv = ["--results-dir", pytestconfig.getoption("--pd-results-dir"),
            "--profile", pytestconfig.getoption("--pd-profile")]
    for opt, flag in RUN_OPTIONS:
        if pytestconfig.getoption(opt) is not None:
            argv += [flag, str(pytestconfig.getoption(opt))]
    return argv + list(pytestconfig.getoption("--pd-run-arg"))


@pytest.fixture(scope="session")
def pd_options(pd_run_argv: list[str]):
    from harness.cli.run import options_from, run_parser

    return options_from(run_parser().parse_args(pd_run_argv))


@pytest.fixture(scope="session")
def pd_policy(pd_options):
    from harness.judge.verdict import Policy

    return Policy.from_options(pd_options)


@pytest.fixture(scope="session")
def pd_runner(pytestconfig: pytest.Config, pd_options, pd_policy):
    from harness.run.runner import Runner
    from harness.serve.supervision.process import install_signal_handlers
    from harness.serve.launch.server_spec import Features

    install_signal_handlers()
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    say = (lambda m: reporter.write_line(f"[pd-accuracy] {m}")) if reporter else print
    runner = Runner(pd_options, pd_policy, features=Features.detect(), progress=say,
                    run_id=run_id(pytestconfig))
    yield runner
    runner.close()   # a group started ahead that no test took (-x, an interrupted session)


@pytest.fixture(scope="session")
def pd_judge(pd_runner):
    """pd_judge(cell) -> CellResult; pd_judge([cells]) -> [CellResult]: real servers, real
    evaluation, one verdict per cell (cells sharing a baseline share its server). `then`: the
    cells the caller judges next, whose servers may start during this call's last pair."""
    def judge(cells, then=()):
        single = not isinstance(cells, (list, tuple))
        results = pd_runner.run([cells] if single else list(cells), then=list(then))
        return results[0] if single else results
    return judge


@pytest.fixture(scope="session")
def pd_baseline(pd_runner):
    """with pd_baseline(cell) as endpoint: endpoint.base_url, endpoint.metrics_url, ..."""
    return pd_runner.running_baseline


@pytest.fixture(scope="session")
def pd_pair(pd_runner):
    """with pd_pair(cell) as pair: pair.proxy_url, pair.decode_metrics_urls, pair.records_path"""
    return pd_runner.running_pair


_RAN_SERVERS = pytest.StashKey[bool]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if starts_servers(item):
        item.session.stash[_RAN_SERVERS] = True


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No process of the run may outlive it (stop stragglers, fail loudly); then, once for the
    whole run (the xdist controller, or the only process), render the run's annotation, history
    and HTML report, which must name every cell that has a record."""
    from harness.serve.supervision.process import live_processes, stop_all, sweep_orphans

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    say = (lambda m: reporter.write_line(m, red=True)) if reporter else print
    # this interpreter's servers, and any server group on this host whose harness is dead
    # (farm jobs, killed runs: the process ledger); the sweep stops those itself. An xdist worker
    # that ran no server test leaves the sweep to the controller: it may end while another
    # worker's test has just killed a harness on purpose (test_teardown), its watchdog not yet
    # done
    sweep = not hasattr(session.config, "workerinput") or session.stash.get(_RAN_SERVERS, False)
    leftovers = [p for p in live_processes() if p.is_running()] + (sweep_orphans() if sweep else [])
    if leftovers:
        names = ", ".join(f"{p.name} (pid {p.pid})" for p in leftovers)
        stop_all()
        say(f"pd-accuracy: servers still running at session end were stopped: {names}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if not hasattr(session.config, "workerinput"):
        missing = render_run_outputs(results_dir(session.config))
        if missing:
            say(f"pd-accuracy: the run's annotation/report lack {missing}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def render_run_outputs(run_dir: Path) -> list[str]:
    """annotation.md, history.sqlite and report/ of a run's records; what they lack (cell ids).
    Nothing to do for a run that judged no cell."""
    from harness.report.annotate import annotate
    from harness.report.history import append_results_dir
    from harness.report.html import render_report
    from harness.run.record import load_records

    records = load_records(run_dir) if run_dir.is_dir() else []
    if not records:
        return []
    ids = sorted({r["cell"]["id"] for r in records})
    annotation = annotate(run_dir, run_dir / "annotation.md", agent=False).path.read_text()
    db = run_dir / "history.sqlite"
    append_results_dir(db, run_dir)
    html = Path(render_report(db, run_dir / "report")).read_text()
    return [cid for cid in ids if f"`{cid}`" not in annotation or cid not in html]


def results_dir(config: pytest.Config) -> Path:
    return Path(config.getoption("--pd-results-dir")) / run_id(config)
