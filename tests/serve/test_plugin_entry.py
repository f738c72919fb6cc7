"""The contract every vLLM general plugin of the harness keeps (harness.serve.plugins.entry):
set up once per process, only when wanted, never raising into vLLM."""
from __future__ import annotations

import logging

from harness.serve.plugins.entry import vllm_plugin

LOG = logging.getLogger("test.plugin_entry")


def test_setup_runs_once_however_often_vllm_calls_register():
    calls = []

    @vllm_plugin(LOG, "failed")
    def register() -> None:
        """docstring kept"""
        calls.append(1)

    register()
    register()
    assert calls == [1] and register.__doc__ == "docstring kept"


def test_a_plugin_not_wanted_yet_runs_once_it_is():
    wanted, calls = [False], []
    register = vllm_plugin(LOG, "failed", wanted=lambda: wanted[0])(lambda: calls.append(1))
    register()
    assert calls == [] and not register.done
    wanted[0] = True
    register()
    register()
    assert calls == [1]


def test_a_failing_setup_is_logged_with_its_line_and_never_raised(caplog):
    def boom() -> None:
        raise ValueError("bad value")

    register = vllm_plugin(LOG, "pd-accuracy x: register() failed; vLLM left as is")(boom)
    with caplog.at_level(logging.ERROR, logger="test.plugin_entry"):
        register()
        register()
    assert [r.getMessage() for r in caplog.records] == [
        "pd-accuracy x: register() failed; vLLM left as is"]
    assert "bad value" in caplog.text    # the traceback goes with it


def test_every_entry_point_in_pyproject_keeps_the_contract():
    import importlib
    import tomllib
    from pathlib import Path

    from harness.serve.plugins.entry import PluginEntry

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    targets = project["project"]["entry-points"]["vllm.general_plugins"].values()
    assert len(targets) >= 8
    for target in targets:
        module, _, name = target.partition(":")
        assert isinstance(getattr(importlib.import_module(module), name), PluginEntry), target
