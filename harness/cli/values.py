"""What an option's text may be: argparse types that parse it into its value or say why not in
one line, at parse time (before any command runs). Each is a `Value` that carries its kind and
bounds, so that docs/cli.md and the generated-input tests read them from the parser.

Values come back as what the rest of the harness reads: numbers as int or float, everything
else as its canonical text (a command line is rebuilt from them for release and packed runs).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable

MAX_TEXT = 4096            # a value longer than this is no option value (an argv limit is 128 KiB)
MAX_GPUS = 1024            # more GPUs than any host has: a pretend machine never allocates more
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_INT = re.compile(r"[+-]?[0-9]{1,30}")
UNWRITABLE_ROOTS = ("/proc", "/sys", "/dev")


class Value:
    """An argparse type: `parse(text)` raises ValueError with the reason; refusals are one line
    ("argument --limit: must be ...")."""

    def __init__(self, kind: str, parse: Callable[[str], Any], max_chars: int = MAX_TEXT,
                 **meta: Any) -> None:
        self.kind, self.parse, self.max_chars, self.meta = kind, parse, max_chars, meta
        self.__name__ = kind    # argparse names the type in its own messages

    def __call__(self, text: str) -> Any:
        text = str(text)
        if "\x00" in text:
            raise argparse.ArgumentTypeError("holds a NUL byte")
        if len(text) > self.max_chars:
            raise argparse.ArgumentTypeError(f"{len(text)} characters; at most {self.max_chars}")
        try:
            return self.parse(text)
        except (ValueError, OverflowError) as exc:
            raise argparse.ArgumentTypeError(" ".join(str(exc).split())[:400]) from None

    def __repr__(self) -> str:
        return f"Value({self.kind})"


def shown(text: str) -> str:
    """A value quoted for a one-line message, cut to 40 characters."""
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _bounds(low: float, high: float, low_open: bool) -> str:
    return f"{'(' if low_open else '['}{low:g}, {high:g}]"


def number(low: float, high: float, *, integer: bool = False, low_open: bool = False,
           what: str = "a number") -> Value:
    """A finite number in [low, high] ((low, high] with low_open); ASCII digits only."""
    def parse(text: str) -> int | float:
        raw = text.strip()
        if integer:
            if not _INT.fullmatch(raw):
                raise ValueError(f"must be a whole number from {int(low)} to {int(high)}, got {shown(text)}")
            value: int | float = int(raw)
        else:
            if not raw.isascii():
                raise ValueError(f"must be {what} in {_bounds(low, high, low_open)}, got {shown(text)}")
            value = float(raw)
            if not math.isfinite(value):
                raise ValueError(f"must be a finite number, got {shown(text)}")
        if value < low or value > high or (low_open and value == low):
            rng = (f"from {int(low)} to {int(high)}" if integer else _bounds(low, high, low_open))
            raise ValueError(f"must be {'a whole number ' if integer else what + ' '}{rng}, "
                             f"got {shown(text)}")
        return value
    return Value("number", parse, max_chars=400, low=low, high=high, integer=integer,
                 low_open=low_open)


def whole(low: int, high: int) -> Value:
    return number(low, high, integer=True)


def choice(values: Iterable[str], what: str, *, ignore_case: bool = False) -> Value:
    """One of `values` (exactly, or but for case with ignore_case); a refusal says the closest."""
    known = tuple(values)

    def parse(text: str) -> str:
        from harness.core.suggest import canonical, did_you_mean

        if text in known:
            return text
        found = canonical(text, known) if ignore_case else None
        if found is not None:
            return found
        raise ValueError(f"unknown {what} {shown(text)}{did_you_mean(text, known)} "
                         f"(use one of {', '.join(known)})")
    return Value("choice", parse, max_chars=200, values=known, ignore_case=ignore_case)


def text(what: str = "text", max_chars: int = MAX_TEXT, *, empty: bool = False) -> Value:
    """Free text: no NUL byte, at most max_chars, not empty (unless `empty`)."""
    def parse(value: str) -> str:
        if not empty and not value.strip():
            raise ValueError(f"{what} is empty")
        return value
    return Value("text", parse, max_chars=max_chars, what=what)


def env_name() -> Value:
    def parse(value: str) -> str:
        if not ENV_NAME.fullmatch(value):
            raise ValueError(f"{shown(value)} is not an environment variable name")
        return value
    return Value("env-name", parse, max_chars=128)


def safe_name(what: str) -> Value:
    def parse(value: str) -> str:
        from harness.core.safe_paths import safe_name_problem

        problem = safe_name_problem(value, what)
        if problem:
            raise ValueError(problem)
        return value
    return Value("name", parse, max_chars=200)


def existing(kind: str, what: str) -> Value:
    """A path that exists: kind "file" (a regular file) or "dir"."""
    def parse(value: str) -> str:
        if not value.strip():
            raise ValueError(f"{what} is empty")
        path = Path(value).expanduser()
        try:
            ok = path.is_file() if kind == "file" else path.is_dir()
        except OSError as exc:   # a name too long, a loop of links
            raise ValueError(f"{shown(value)}: {exc.strerror or exc}") from None
        if not ok:
            raise ValueError(f"{shown(value)} is not {'a file' if kind == 'file' else 'a directory'}")
        return value
    return Value(f"existing-{kind}", parse, path_kind=kind)


def writable(kind: str, what: str) -> Value:
    """A path a file (kind "file") or directory ("dir") can be written at; nothing is created."""
    def parse(value: str) -> str:
        if not value.strip():
            raise ValueError(f"{what} is empty")
        try:
            problem = writable_problem(value, what, kind)
        except OSError as exc:
            problem = f"{shown(value)}: {exc.strerror or exc}"
        if problem:
            raise ValueError(problem.removeprefix(f"{what} "))
        return value
    return Value(f"writable-{kind}", parse, path_kind=kind)


def writable_problem(path: str, what: str, kind: str = "file") -> str | None:
    """One line unless a regular file (kind "file") or a directory ("dir") can be written at
    `path`: not under a pseudo file system, not something else already, and its nearest
    existing ancestor (for a file: its directory's) a directory this user may write."""
    file = kind == "file"
    if "\x00" in path:
        return f"{what} holds a NUL byte"
    target = Path(path).expanduser().resolve()
    if any(str(target) == root or str(target).startswith(root + "/") for root in UNWRITABLE_ROOTS):
        return f"{what} {path!r} is not {'on a file system' if file else 'a directory'} for results"
    if target.exists() and not (target.is_file() if file else target.is_dir()):
        return f"{what} {path!r} exists and is not {'a regular file' if file else 'a directory'}"
    existing = target.parent if file else target
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return f"{what} {path!r}: {existing} is not a writable directory"
    return None



def pair(inner: Value, what: str) -> Value:
    """N or PREFILL:DECODE of `inner` values, as canonical text ("64" or "64:128")."""
    def parse(value: str) -> str:
        parts = value.split(":")
        if len(parts) not in (1, 2):
            raise ValueError(f"{what} must be N or PREFILL:DECODE, got {shown(value)}")
        try:
            return ":".join(str(inner.parse(p)) for p in parts)
        except ValueError as exc:
            raise ValueError(f"{what} must be N or PREFILL:DECODE: {exc}") from None
    return Value("pair", parse, max_chars=200, inner=inner)


def split_pair(value: str, cast: Callable[[str], Any] = int) -> tuple[Any, Any]:
    """A `pair` value -> (prefill, decode)."""
    parts = [cast(p) for p in str(value).split(":")]
    return (parts[0], parts[-1])


def weather_param() -> Value:
    """NAME=NUMBER, a finite number; the rules check the name and its bounds per weather."""
    def parse(value: str) -> str:
        name, sep, raw = value.partition("=")
        if not sep or not re.fullmatch(r"[a-z_]{1,40}", name.strip()):
            raise ValueError(f"must be NAME=NUMBER, got {shown(value)}")
        found = float(number(-1e15, 1e15, what="a number").parse(raw))
        return f"{name.strip()}={int(found) if found.is_integer() else found}"
    return Value("weather-param", parse, max_chars=200)


def fault_block() -> Value:
    def parse(value: str) -> str:
        if value in ("first", "last") or re.fullmatch(r"[0-9]{1,6}", value):
            return value
        raise ValueError(f"must be first, last or a block index (0-999999), got {shown(value)}")
    return Value("fault-block", parse, max_chars=40)


def platform(allow_any: bool = False) -> Value:
    """cpu, cpu:ISA+ISA, cuda:N or cuda:N:GiB (N at most MAX_GPUS); `any` where allowed."""
    def parse(value: str) -> str:
        from harness.core.platform import PlatformInfo

        spec = value.strip().lower()
        if allow_any and spec == "any":
            return spec
        PlatformInfo.from_spec(spec)   # its ValueError is the one line
        return spec
    return Value("platform", parse, max_chars=400, allow_any=allow_any)


def shard() -> Value:
    def parse(value: str) -> str:
        from harness.matrix import MatrixError, parse_shard

        try:
            index, count = parse_shard(value)
        except MatrixError as exc:
            raise ValueError(str(exc).removeprefix(f"--shard {value!r}: ")) from None
        if count > 100_000:
            raise ValueError(f"at most 100000 shards, got {count}")
        return f"{index}/{count}"
    return Value("shard", parse, max_chars=40)


def keyword() -> Value:
    """A pytest-style -k expression on cell ids; its syntax is checked here."""
    def parse(value: str) -> str:
        from harness.matrix import MatrixError
        from harness.matrix.selection import _keyword_matches

        try:
            _keyword_matches(value, "cell")
        except MatrixError as exc:
            raise ValueError(str(exc)) from None
        return value
    return Value("keyword", parse, max_chars=2000)


def count_or_auto(low: int, high: int) -> Value:
    """auto, or a whole number in [low, high] (as text: auto stays auto)."""
    def parse(value: str) -> str:
        if value.strip().lower() == "auto":
            return "auto"
        return str(whole(low, high).parse(value))
    return Value("count-or-auto", parse, max_chars=40, low=low, high=high)


def queues() -> Value:
    """JSON: GPUs needed -> agent queue."""
    def parse(value: str) -> str:
        from harness.ci.pipeline import normalize_queues

        try:
            data = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"is not JSON ({exc.msg})") from None
        if not isinstance(data, dict):
            raise ValueError("must be a JSON object of GPU count -> queue name")
        try:
            normalize_queues(data)
        except (TypeError, KeyError) as exc:
            raise ValueError(str(exc)) from None
        return value
    return Value("queues", parse, max_chars=4096)


def releases(allow_none: bool = False) -> Value:
    """Comma-separated vLLM releases (versions, .whl files, checkouts); `none` where allowed."""
    def parse(value: str) -> str:
        from harness.core.vllm_releases import parse_releases

        if allow_none and value.strip().lower() == "none":
            return "none"
        parse_releases(value, package="vllm", source="the list")
        return ",".join(p.strip() for p in value.split(",") if p.strip())
    return Value("releases", parse, allow_none=allow_none)


def release() -> Value:
    def parse(value: str) -> str:
        from harness.core.vllm_releases import parse_release

        parse_release(value, package="vllm")
        return value.strip()
    return Value("release", parse)


def compare_on() -> Value:
    def parse(value: str) -> str:
        if value in ("outcome", "digest") or re.fullmatch(r"check:[a-z0-9_-]{1,60}", value):
            return value
        raise ValueError(f"expected outcome, digest or check:NAME, got {shown(value)}")
    return Value("compare-on", parse, max_chars=80)


__all__ = ["MAX_GPUS", "MAX_TEXT", "Value", "choice", "compare_on", "count_or_auto",
           "env_name", "existing", "fault_block", "keyword", "number", "pair", "platform",
           "queues", "release", "releases", "safe_name", "shard", "shown", "split_pair", "text",
           "weather_param", "whole", "writable", "writable_problem"]
