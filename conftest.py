"""pytest wiring for pd-accuracy: the `pd_accuracy` marker, the suite's options, and a session
guard that fails the run if any server the harness started is still alive at the end."""
from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("pd-accuracy")
    g.addoption("--pd-profile", default="smoke", help="matrix profile to parametrize (default smoke)")
    g.addoption("--pd-matrix", default=None, help="matrix YAML (default harness/matrix/default.yaml)")
    g.addoption("--pd-results-dir", default="results/runs", help="where records are written")
    g.addoption("--pd-limit", type=int, default=None, help="questions per cell (default: profile's)")
    g.addoption("--pd-alpha", type=float, default=0.01, help="significance level of the verdict")
    g.addoption("--pd-max-mde", type=float, default=0.25,
                help="a PASS must be able to detect an accuracy drop this large (80%% power)")
    g.addoption("--pd-in-process", action="store_true",
                help="run the cells in this pytest process instead of through `pd-accuracy farm "
                     "--local` (the default: the generated Buildkite steps as subprocesses, then "
                     "annotation, history and HTML report)")
    g.addoption("--pd-run-arg", action="append", default=[],
                help="extra argument for every `pd-accuracy run` of the farm (repeatable), "
                     "e.g. --pd-run-arg=--num-fewshot=1")
    g.addoption("--pd-platform", default=None,
                help="expand for this platform instead of this machine (cpu, cuda:N)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pd_accuracy: a real P/D pair against a real baseline (starts vLLM servers)")
    config.addinivalue_line("markers", "slow: starts real processes; takes more than a few seconds")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No process of the run may outlive it: stop stragglers and fail loudly if there were any."""
    try:
        from harness.serve.process import live_processes, stop_all
    except ImportError:
        return
    leftovers = [p for p in live_processes() if p.is_running()]
    if leftovers:
        names = ", ".join(f"{p.name} (pid {p.pid})" for p in leftovers)
        stop_all()
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"pd-accuracy: servers still running at session end were stopped: {names}", red=True)
        session.exitstatus = 1
