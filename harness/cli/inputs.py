"""The inputs of a command, parsed and checked before any process, environment or file is
created (harness.cli.front_door runs these): which options the command line gave, the
PD_ACCURACY_* variables each command reads, a cell's extra_env. Every problem is one line.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from harness.cli.values import MAX_GPUS, shown
from harness.core.outcomes import EXIT_USAGE

# the commands that start servers or hand their environment to commands that do
SERVER_COMMANDS = ("run", "warm", "bench", "bisect", "farm", "pytest")
RELEASE_COMMANDS = ("run", "bisect", "pipeline")
CACHE_COMMANDS = SERVER_COMMANDS + ("doctor", "zoo", "list", "pipeline")


@dataclass
class Admission:
    """What the front door let in: the run's options and the cells it selected (cell commands)."""

    options: Any = None
    cells: list = field(default_factory=list)
    catalog: Any = None
    not_applicable: list = field(default_factory=list)


# ---- options given on the command line ---------------------------------------------------------

def given_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> dict[str, str]:
    """dest -> the option as written, for each option present in `argv` (abbreviations are off,
    so a token names an option only by its own spelling)."""
    spelled: dict[str, str] = {}
    for action in parser._actions:   # noqa: SLF001
        for option in action.option_strings:
            spelled[option] = action.dest
    given: dict[str, str] = {}
    for token in argv:
        if token == "--":
            break
        name = token.split("=", 1)[0] if token.startswith("--") else token[:2]
        if name in spelled and token.startswith("-"):
            given.setdefault(spelled[name], name)
    return given


def given(args: argparse.Namespace, dest: str) -> bool:
    """Whether option `dest` was given (by the command line where known, else by its value)."""
    known = getattr(args, "given", None)
    if known is not None:
        return dest in known
    value = getattr(args, dest, None)
    return value not in (None, False, [], ())


def spelled(args: argparse.Namespace, dest: str) -> str:
    return (getattr(args, "given", None) or {}).get(dest) or "--" + dest.replace("_", "-")


def refuse_unless_used(args: argparse.Namespace, dests: Iterable[str], why: str) -> list[str]:
    """One line naming the options of `dests` that were given although `why` says they are not used."""
    named = [spelled(args, d) for d in dests if given(args, d)]
    return [f"{', '.join(named)}: {why}"] if named else []


# ---- PD_ACCURACY_* variables -----------------------------------------------------------------

def _whole(low: int, high: int) -> Callable[[str], None]:
    def check(value: str) -> None:
        if not re.fullmatch(r"[0-9]{1,12}", value.strip()) or not low <= int(value) <= high:
            raise ValueError(f"expected a whole number from {low} to {high}")
    return check


def _one_of(*allowed: str) -> Callable[[str], None]:
    def check(value: str) -> None:
        if value.strip().lower() not in allowed:
            raise ValueError(f"expected one of {', '.join(a or '(empty)' for a in allowed)}")
    return check


def _dir_path(must_exist: bool = False, holds: str | None = None) -> Callable[[str], None]:
    def check(value: str) -> None:
        from pathlib import Path

        if len(value) > 4096:
            raise ValueError("longer than 4096 characters")
        path = Path(value).expanduser()
        if not path.is_absolute():
            raise ValueError("expected an absolute path (or ~/...)")
        if not must_exist and any(part == ".." for part in path.parts):
            # a folder the harness creates and writes: '..' would let it climb out of where
            # the caller meant; a folder that must exist (data to read) is read where it resolves
            raise ValueError("expected a path without '..'")
        if str(path.resolve()).startswith(("/proc", "/sys", "/dev")):
            raise ValueError("not a directory the harness may write")
        try:
            if must_exist and not path.is_dir():
                raise ValueError("is not a directory")
            if holds and not (path / holds).is_file():
                raise ValueError(f"holds no {holds}")
        except OSError as exc:
            raise ValueError(exc.strerror or str(exc)) from None
    return check


def _package(value: str) -> None:
    # a PEP 508 distribution name: anything else would reach uv's command line as an option
    if not re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?", value.strip()):
        raise ValueError("expected a package name (letters, digits, '.', '_', '-')")


def _with(parse: Callable[[Mapping[str, str]], Any], name: str) -> Callable[[str], None]:
    """A server-side parser of `{name: value}` (the plugin's own), used as a check."""
    def check(value: str) -> None:
        parse({name: value})
    return check


def _server_checks() -> dict[str, Callable[[str], None]]:
    from harness.connectors import variable_parsers
    from harness.protocol.kv_digest import HASH_ENV, hash_choice
    from harness.protocol.switches import MQ_SPIN_SLEEP_ENV as SPIN_ENV
    from harness.protocol.switches import parse_mq_spin_sleep_us as parse_sleep_us

    switch = _one_of("", "0", "1")
    connectors = {name: (lambda v, n=name, parse=parse: (_whole(0, 10_000_000)(v), parse({n: v})))
                  for name, parse in variable_parsers().items()}
    return {**connectors,
        "PD_ACCURACY_MAX_STARTING": _whole(0, 100_000),
        "PD_ACCURACY_SERVER_START": _one_of("", "auto", "exec", "template"),
        "PD_ACCURACY_PARALLEL_GROUPS": lambda v: None if v.strip().lower() in ("", "auto")
        else _whole(1, 4096)(v),
        HASH_ENV: lambda v: hash_choice({HASH_ENV: v}),
        "PD_ACCURACY_GSM8K_DIR": _dir_path(must_exist=True, holds="test.jsonl"),
        SPIN_ENV: lambda v: (_whole(1, 10_000_000)(v), _with(parse_sleep_us, SPIN_ENV)(v)),
        "PD_ACCURACY_YIELD_STARTUPS": switch, "PD_ACCURACY_FORK_START": switch,
        "PD_ACCURACY_SHARED_COMPILE_CACHE": switch, "PD_ACCURACY_SHARE_GLOO_GROUPS": switch,
        "PD_ACCURACY_AMX_PERMISSION": _one_of("", "0", "1", "true", "false", "on", "off", "yes", "no"),
        "PD_ACCURACY_GPUS": _whole(0, MAX_GPUS),
    }


def env_checks(command: str) -> dict[str, Callable[[str], None]]:
    """The variables `command` reads, each with the check of its value (ValueError: why not)."""
    checks: dict[str, Callable[[str], None]] = {}
    if command in CACHE_COMMANDS:
        checks["PD_ACCURACY_CACHE"] = _dir_path()
        checks["PD_ACCURACY_CACHE_DIR"] = _dir_path()
    if command in SERVER_COMMANDS:
        checks.update(_server_checks())
    if command in RELEASE_COMMANDS:
        checks["PD_ACCURACY_VLLM_PACKAGE"] = _package
        checks["PD_ACCURACY_VLLM_ENVS"] = _dir_path()
    return checks


def env_problems(command: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per PD_ACCURACY_* variable `command` reads whose value it could not use; a
    canary's variables are refused in the harness's own environment (they are a cell's)."""
    environ = os.environ if environ is None else environ
    problems = []
    for name, check in env_checks(command).items():
        value = environ.get(name)
        if value is None or value == "":
            continue
        problem = _value_problem(check, value)
        if problem:
            problems.append(f"${name}={shown(value)}: {problem}")
    if command in SERVER_COMMANDS:
        for name in sorted(environ):
            if name.startswith(("PD_ACCURACY_FAULT", "PD_ACCURACY_PREFILL_FAULT")):
                problems.append(f"${name} is set in the environment: a canary's variables belong "
                                f"to its cell (the matrix's extra_env, or --fault options)")
    return problems


def _value_problem(check: Callable[[str], Any], value: str) -> str | None:
    if "\x00" in value:
        return "holds a NUL byte"
    try:
        check(value)
    except (ValueError, OverflowError) as exc:
        return " ".join(str(exc).split())[:300]
    return None


def extra_env_problems(cell_id: str, env: Sequence[tuple[str, str]]) -> list[str]:
    """A cell's extra_env: the variables of its canary (parsed as the decode's plugin parses
    them) and the harness's other variables, checked now rather than in a started server."""
    values = dict(env)
    problems = []
    checks = _server_checks()
    for name, value in values.items():
        if not name.startswith("PD_ACCURACY_"):
            continue
        if name.startswith(("PD_ACCURACY_FAULT", "PD_ACCURACY_PREFILL_FAULT")):
            problem = fault_variable_problem(name, value, values)
        elif name in checks:
            problem = _value_problem(checks[name], value)
        else:
            from harness.core.suggest import did_you_mean
            problem = f"not a variable the harness reads{did_you_mean(name, _known_variables())}"
        if problem:
            problems.append(f"cell {cell_id[:80]}: extra_env {name}={shown(value)}: {problem}")
    return problems


def _known_variables() -> list[str]:
    from harness.protocol import faults as spec

    return list(_server_checks()) + [spec.FAULT_ENV, spec.BLOCK_ENV, spec.VALUE_ENV,
                                     spec.SHARE_ENV, spec.AFTER_ENV, spec.SCALE_ENV,
                                     spec.HOLD_ENV, spec.PREFILL_FAULT_ENV]


def fault_variable_problem(name: str, value: str, env: Mapping[str, str]) -> str | None:
    """Why the fault plugin would refuse `name`=`value` in a server, or None."""
    from harness.protocol import faults as spec

    raw = value.strip()
    if name == spec.SHARE_ENV:
        ok = re.fullmatch(r"[0-9.eE+-]{1,40}", raw) and _finite_in(raw, 0, 1, low_open=True)
        return None if ok else "expected a share in (0, 1]"
    if name == spec.AFTER_ENV:
        return None if re.fullmatch(r"[0-9]{1,7}", raw) else \
            "expected a whole number of requests (0-9999999)"
    if name in (spec.SCALE_ENV, spec.HOLD_ENV):
        ok = re.fullmatch(r"[0-9.eE+-]{1,40}", raw) and _finite_in(raw, 0, 3600, low_open=True)
        return None if ok else "expected a positive finite number"
    if name == spec.PREFILL_FAULT_ENV:
        allowed = spec.PREFILL_FAULT_KINDS + (spec.BY_REQUEST,)
        return None if raw in allowed else f"expected one of {', '.join(allowed)}"
    if name == spec.BLOCK_ENV and re.fullmatch(r"-?[0-9]{7,}", raw):
        return "expected first, last, all or a block position (at most 6 digits)"
    if name in (spec.FAULT_ENV, spec.BLOCK_ENV, spec.VALUE_ENV):
        kind = env.get(spec.FAULT_ENV, "corrupt-block")
        try:
            spec.parse_fault_env({**env, spec.FAULT_ENV: kind})
        except ValueError as exc:
            return str(exc)
        return None
    return "not a variable of the fault plugin"


def _finite_in(raw: str, low: float, high: float, low_open: bool = False) -> bool:
    try:
        value = float(raw)
    except ValueError:
        return False
    return math.isfinite(value) and (low < value if low_open else low <= value) and value <= high


# ---- reporting ----------------------------------------------------------------------------------

def one_line(problems: Sequence[str]) -> str:
    """The first problem, and how many more there are: bad input is one line."""
    more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
    return " ".join(str(problems[0]).split()) + more


def report(problem: str, stream=None) -> int:
    from harness.core.redact import redact

    print(f"pd-accuracy: error: {redact(problem)[:700]}", file=stream or sys.stderr)
    return EXIT_USAGE


__all__ = ["Admission", "env_checks", "env_problems", "extra_env_problems",
           "fault_variable_problem", "given", "given_options", "one_line", "refuse_unless_used",
           "report", "spelled"]
