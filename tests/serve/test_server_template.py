"""The server template (harness.serve.template.server + template_client): one interpreter that
imported vLLM forks each server into its own session, environment, log, cores and exit status.
The real template with the installed vLLM; the forked "server" is `api_server --help` (it
parses its argv and exits 0) or a bad flag (exit 2), so no engine starts."""
from __future__ import annotations

import os
import sys
import time

import pytest

from harness.core.options import RunOptions, UsageError
from harness.serve.supervision.process import ManagedProcess
from harness.serve.launch.server_spec import build_argv, cpu_affinity
from harness.serve.template.client import SERVER_MODULE, ServerTemplate, template_for
from tests.server_specs import make_spec

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    core = sorted(os.sched_getaffinity(0))[-1]
    tpl = ServerTemplate(sys.executable, tmp_path_factory.mktemp("tpl"), cores={core})
    yield tpl.start()
    tpl.stop()


def _run(template, tmp_path, args, env_extra):
    log = tmp_path / "server.log"
    env = {**os.environ, **env_extra}
    proc = ManagedProcess("forked", [sys.executable, "-m", SERVER_MODULE, *args], log, env=env,
                          cpu_affinity=template.cores, template=template)
    proc.start()
    pid, session = proc.pid, None
    for _ in range(200):            # it leads its own session a moment after the fork
        try:
            session = os.getsid(pid)
        except ProcessLookupError:
            break
        if session == pid:
            break
        time.sleep(0.005)
    rc = proc._popen.wait(120)
    proc.stop()
    return rc, log.read_text(), pid, session


def test_a_fork_runs_the_server_module_with_its_own_argv_log_and_session(template, tmp_path):
    rc, log, pid, session = _run(template, tmp_path, ["--help"], {"PD_TEMPLATE_PROBE": "x"})
    assert rc == 0, log
    assert "--model" in log and "usage" in log.lower()      # the server's own argparse output
    assert session == pid                                     # led its own session
    assert template.process.is_running()                      # the template serves on


def test_a_failing_server_reports_its_exit_status(template, tmp_path):
    rc, log, _, _ = _run(template, tmp_path, ["--no-such-flag"], {})
    assert rc == 2, log
    assert "no-such-flag" in log


def test_template_refuses_servers_of_other_cores_or_launches(template, tmp_path):
    other = {c for c in range(os.cpu_count() or 1)} - set(template.cores)
    with pytest.raises(ValueError):
        template.launch([sys.executable, "-m", SERVER_MODULE], {}, None, tmp_path / "x.log",
                        other or None)
    assert not template.can_run(["ip", "netns", "exec", "ns", sys.executable, "-m", SERVER_MODULE])


def test_one_template_per_python_log_folder_and_cores(tmp_path):
    a = template_for("/py", tmp_path, {0})
    assert template_for("/py", tmp_path, [0]) is a
    assert template_for("/py", tmp_path, {1}) is not a
    assert template_for("/py", tmp_path, None) is not a


def test_deployment_forks_plain_launches_only(tmp_path):
    from harness.serve.deploy import Deployment

    spec = make_spec("baseline", "cpu", cpu_cores="0", python=sys.executable)
    plain = Deployment("d", [spec], log_dir=tmp_path, server_start="template")._process(spec)
    assert plain.template is not None and plain.template.cores == cpu_affinity(spec)
    execd = Deployment("d", [spec], log_dir=tmp_path)._process(spec)
    assert execd.template is None and execd.argv == build_argv(spec)


def test_server_start_is_checked_before_anything_starts():
    with pytest.raises(UsageError, match="--server-start"):
        RunOptions(server_start="zygote")


@pytest.mark.parametrize("kw,forks", [
    (dict(device="cpu", cpu_cores="0"), True),                    # pinned TP1 CPU: the smoke cells
    (dict(device="cpu", cpu_cores=None), False),                  # unpinned: forks would share a core
    (dict(device="cpu", cpu_cores="0-1", tp=2), False),           # TP2 spawns its ranks
    (dict(device="cuda"), False),                                 # measured, not in the GPU reference
])
def test_auto_forks_pinned_tp1_cpu_servers_only(kw, forks):
    from harness.serve.deploy import uses_template

    spec = make_spec("decode", **kw)
    assert uses_template("auto", spec) is forks
    assert uses_template("template", spec) is True
    assert uses_template("exec", spec) is False


def test_a_run_stops_the_templates_of_its_own_log_folder_only(tmp_path):
    """A pytest session ends with a check that no server process is left; a template is one
    until its run's Runner.close() stops it."""
    from harness.serve.template import client as template_client

    mine = template_for("/py", tmp_path / "mine", {0})
    other = template_for("/py", tmp_path / "other", {0})
    template_client.stop_templates(tmp_path / "mine")
    assert template_for("/py", tmp_path / "mine", {0}) is not mine     # gone: a new one
    assert template_for("/py", tmp_path / "other", {0}) is other
    template_client.stop_templates(tmp_path / "other")
    template_client.stop_templates(tmp_path / "mine")
