"""Generated hostile values at every option of every command, and at every PD_ACCURACY_* variable
a command reads (Hypothesis): each is one line on stderr and exit 2, with no traceback, no child
process and no file created. The values are drawn per option from what its type refuses (NaN,
infinities, 400-digit numbers, full-width digits, NUL bytes, names over 255 characters,
option-lookalikes, '..', unknown names), so a new option is covered the day it is added.

Bounded for CI on 2 cores: a fixed seed, tens of examples per option, the parser built once,
every way to start a process refused (tests/cli/sandbox.py)."""
from __future__ import annotations

import argparse
import contextlib
import io
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import inputs
from harness.cli.main import build_parser, main
from harness.cli.surface import commands
from harness.cli.values import Value
from tests.cli.sandbox import enter, error_lines, files

PARSER = build_parser()
# what each command needs besides the option under test, so that nothing but that option is wrong
BASE = {
    "run": ["run", "--dry-run", "--platform", "cpu"],
    "warm": ["warm", "--dry-run", "--platform", "cpu"],
    "bench": ["bench", "--platform", "cpu"],
    "bisect": ["bisect", "--good", "0.31.0", "--bad", "0.32.0", "--vllm", "0.31.0,0.32.0",
               "--dry-run", "--platform", "cpu", "-k", "tiny-llama-gsm"],
    "list": ["list", "--platform", "cpu"],
    "pipeline": ["pipeline", "--profile", "smoke"],
    "farm": ["farm", "--profile", "smoke", "--dry-run"],
    "annotate": ["annotate", "--agent", "never"],
    "history": ["history", "--results-dir", "{tmp}/records"],
    "report": ["report", "--results-dir", "{tmp}/records", "--history", "{tmp}/h.sqlite"],
    "calibration": ["calibration", "--results-dir", "{tmp}/records"],
    "zoo build": ["zoo", "build", "tiny-llama-gsm"],
    "zoo eval": ["zoo", "eval", "tiny-llama-gsm"],
    "zoo card": ["zoo", "card", "tiny-llama-gsm"],
    "zoo data": ["zoo", "data"],
    "zoo path": ["zoo", "path"],
    "zoo install": ["zoo", "install"],
}
HOSTILE = ["nan", "NaN", "inf", "-inf", "1e400", "-1e400", "9" * 400, "０.３２.０", "１２",
           "0x10", "1_000", "--index-url=http://evil.example/simple", "../../etc", "..",
           "/proc/self/mem", "/", "x" * 300, "a\x00b", "", " ", "-1", "0", "1e30", "\u202e",
           "cuda:999999999", "0.32.0-foo", ",", "A" * 5000, "${HOME}", "$(reboot)", "*"]
# free text where most values are fine: only these options get any text, checked in context
IN_CONTEXT = {"--profile", "--model", "--only"}


def refused_by(action: argparse.Action, text: str) -> bool:
    """Whether the option's own type or choices refuse `text`."""
    if action.choices is not None and not isinstance(action.type, Value):
        return text not in action.choices
    if not isinstance(action.type, Value):
        return False
    try:
        action.type(text)
    except argparse.ArgumentTypeError:
        return True
    return False


def hostile(action: argparse.Action, command: str) -> st.SearchStrategy[str]:
    raw = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=40),
                    st.integers().map(str), st.floats().map(repr),
                    st.integers(256, 600).map(lambda n: "v" * n))
    name = max(action.option_strings, key=len, default=action.dest)
    if name in IN_CONTEXT and command in ("run", "warm", "bench", "bisect", "list"):
        # refused by what the matrix holds: names that are no profile, model or cell
        known = st.text("abcdefghijklmnopqrstuvwxyz-0123456789_", min_size=1, max_size=30)
        return st.one_of(raw.filter(lambda t: refused_by(action, t)),
                         known.map(lambda t: "zz-" + t))
    return raw.filter(lambda t: refused_by(action, t))


def value_options() -> list[tuple[str, argparse.Action]]:
    found = []
    for command, parser in commands(PARSER):
        if command not in BASE:
            continue
        for action in parser._actions:   # noqa: SLF001
            if action.nargs == 0 or action.help == argparse.SUPPRESS or isinstance(
                    action, (argparse._HelpAction, argparse._SubParsersAction)):   # noqa: SLF001
                continue
            found.append((command, action))
    return found


OPTIONS = value_options()
SEEN: set[str] = set()


def _examples(command: str, action: argparse.Action) -> int:
    """40 for an option's first command, 8 for the commands that share it (the same type);
    fewer where each example loads the matrix."""
    name = max(action.option_strings, key=len, default=f"{command}:{action.dest}")
    heavy = name in IN_CONTEXT
    first = name not in SEEN
    SEEN.add(name)
    return (8 if heavy else 40) if first else (3 if heavy else 8)


EXAMPLES = {(c, a.dest): _examples(c, a) for c, a in OPTIONS}


def argv_for(command: str, action: argparse.Action, value: str, tmp: str) -> list[str]:
    base = [a.replace("{tmp}", tmp) for a in BASE[command]]
    if not action.option_strings:   # a positional: the last word of the command
        return base + ["--", value] if value.startswith("-") else base + [value]
    option = max(action.option_strings, key=len)
    if option.startswith("--"):
        return base + [f"{option}={value}"]
    return base + [option + value]   # -kVALUE: a value may start with "-"


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    started = enter(tmp_path, monkeypatch)
    (tmp_path / "records").mkdir()
    return tmp_path, started


def refused_in_one_line(argv: list[str], root, started: list[str]) -> None:
    before = files(root)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv, parser=PARSER)
    lines = error_lines(err.getvalue())
    shown = [a[:80] for a in argv]
    assert code == 2, (shown, out.getvalue()[-500:], err.getvalue()[-500:])
    assert len(lines) == 1 and lines[0].startswith("pd-accuracy: error: "), (shown, lines)
    assert "Traceback" not in out.getvalue() + err.getvalue()
    assert started == [], started
    created = {p for p in files(root) - before if ".cache" not in p.parts}
    assert created == set(), (shown, created)


@pytest.mark.parametrize("command, action", OPTIONS,
                         ids=[f"{c}:{max(a.option_strings, key=len, default=a.dest)}"
                              for c, a in OPTIONS])
def test_a_hostile_value_of_any_option_is_one_line_and_exit_2(command, action, sandbox):
    root, started = sandbox

    @settings(max_examples=EXAMPLES[(command, action.dest)], deadline=None, derandomize=True,
              database=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                    HealthCheck.filter_too_much,
                                                    HealthCheck.too_slow])
    @given(value=hostile(action, command))
    def check(value: str) -> None:
        refused_in_one_line(argv_for(command, action, value, str(root)), root, started)

    check()


# the commands that read PD_ACCURACY_* variables, each with a cheap valid command line
ENV_COMMANDS = {"run": ["run", "--dry-run", "--platform", "cpu", "-k", "p32d32"],
                "warm": ["warm", "--dry-run", "--platform", "cpu", "-k", "p32d32"],
                "pipeline": ["pipeline", "--profile", "smoke"],
                "list": ["list", "--platform", "cpu"],
                "doctor": ["doctor", "--json"]}
VARIABLES = [(c, name) for c in ENV_COMMANDS for name in inputs.env_checks(c)]


def env_value(text: str) -> bool:
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return False
    return "\x00" not in text and text != ""


@pytest.mark.parametrize("command, name", VARIABLES, ids=[f"{c}:{n}" for c, n in VARIABLES])
def test_a_hostile_variable_is_one_line_and_exit_2(command, name, sandbox, monkeypatch):
    root, started = sandbox
    check_value = inputs.env_checks(command)[name]
    refused = lambda t: env_value(t) and inputs._value_problem(check_value, t) is not None  # noqa: E731

    @settings(max_examples=25 if command == "run" else 8, deadline=None, derandomize=True,
              database=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                    HealthCheck.filter_too_much])
    @given(value=st.one_of(st.sampled_from(HOSTILE), st.text(max_size=30)).filter(refused))
    def check(value: str) -> None:
        with monkeypatch.context() as m:
            m.setenv(name, value)
            refused_in_one_line(ENV_COMMANDS[command], root, started)

    check()


def test_every_option_and_variable_is_thrown_at():
    """The two tests above cover every command with value options and every variable read."""
    with_values = {c for c, _ in OPTIONS}
    assert with_values >= {"run", "warm", "bench", "bisect", "list", "pipeline", "farm"}
    assert {n for _, n in VARIABLES} >= {"PD_ACCURACY_MAX_STARTING", "PD_ACCURACY_VLLM_PACKAGE",
                                         "PD_ACCURACY_VLLM_ENVS", "PD_ACCURACY_KV_DIGEST_HASH"}
