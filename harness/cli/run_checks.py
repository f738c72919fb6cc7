"""`pd-accuracy run`'s input, checked before anything starts: each problem one line (exit 2).

argparse checks types; these check what a type cannot: ranges (a negative share, a NaN
timeout), names the harness builds files and environments from (cell ids, env names), paths it
writes (--junit-xml, --results-dir), the task and its data, and sizes that would cost more than
a line (-k expressions, GPU counts). `--allow-auth-env` (a deployment's extra token variables) is
added here too: it is the user's word, never the file's.
"""
from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from harness.core.safe_paths import safe_name_problem

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_KEYWORD_CHARS = 2000
MAX_GPUS = 1024
MAX_STARTUP_TIMEOUT_S = 7 * 24 * 3600
MAX_ARG_CHARS = 4096
UNWRITABLE_ROOTS = ("/proc", "/sys", "/dev")


def add_trust_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-auth-env", action="append", default=[], metavar="NAME",
                   help="with --deployment: let the file name NAME as an auth_env besides the "
                        "PD_* variables (docs/security.md)")


def _number(value: object, what: str, *, low: float, high: float = math.inf,
            low_open: bool = False, integer: bool = False) -> str | None:
    """One line unless `value` is a finite number in [low, high] ((low, high] when low_open)."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return f"{what} must be a number, got {str(value)[:40]!r}"
    if not math.isfinite(number) or number < low or (low_open and number == low) or number > high:
        bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        return f"{what} must be a finite number in {bounds}, got {str(value)[:40]}"
    if integer and number != int(number):
        return f"{what} must be a whole number, got {value}"
    return None


def writable_file_problem(path: str, what: str) -> str | None:
    """One line unless a regular file can be written at `path`."""
    if "\x00" in path:
        return f"{what} holds a NUL byte"
    target = Path(path).expanduser().resolve()
    if any(str(target) == root or str(target).startswith(root + "/") for root in UNWRITABLE_ROOTS):
        return f"{what} {path!r} is not on a file system for results"
    if target.exists() and not target.is_file():
        return f"{what} {path!r} exists and is not a regular file"
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return f"{what} {path!r}: {parent} is not a writable directory"
    return None


def writable_dir_problem(path: str, what: str) -> str | None:
    if "\x00" in path:
        return f"{what} holds a NUL byte"
    target = Path(path).expanduser().resolve()
    if any(str(target) == root or str(target).startswith(root + "/") for root in UNWRITABLE_ROOTS):
        return f"{what} {path!r} is not a directory for results"
    if target.exists() and not target.is_dir():
        return f"{what} {path!r} exists and is not a directory"
    existing = target
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return f"{what} {path!r}: {existing} is not a writable directory"
    return None


def platform_problem(spec: str | None) -> str | None:
    if spec is None:
        return None
    parts = spec.strip().lower().split(":")
    if parts == ["cpu"] or (len(parts) == 2 and parts[0] == "cpu"
                            and re.fullmatch(r"[a-z0-9_]{1,32}(\+[a-z0-9_]{1,32}){0,31}", parts[1])):
        return None   # a CPU, or a pretend one with these ISA flags ("cpu:avx2+avx512f")
    if parts[0] != "cuda" or len(parts) not in (2, 3) or not parts[1].isdigit():
        return (f"--platform {spec[:40]!r}: expected 'cpu', 'cpu:ISA+ISA', 'cuda:N' or "
                "'cuda:N:GiB'")
    if not 1 <= int(parts[1]) <= MAX_GPUS:
        return f"--platform {spec[:40]!r}: N must be 1 to {MAX_GPUS} GPUs"
    if len(parts) == 3:
        return _number(parts[2], "--platform's GiB per GPU", low=0, high=1 << 20, low_open=True)
    return None


def fault_problems(args: argparse.Namespace) -> list[str]:
    problems = []
    block = getattr(args, "fault_block", None)
    if block is not None and block not in ("first", "last") and not re.fullmatch(r"\d{1,6}", block):
        problems.append(f"--fault-block must be first, last or a block index (0-999999), got "
                        f"{block[:40]!r}")
    share = getattr(args, "fault_share", None)
    if share is not None:
        problem = _number(share, "--fault-share", low=0, high=1, low_open=True)
        if problem:
            problems.append(problem)
    after = getattr(args, "fault_after", None)
    if after is not None and not re.fullmatch(r"\d{1,7}", after):
        problems.append(f"--fault-after must be a whole number of requests (0-9999999), got "
                        f"{after[:40]!r}")
    return problems


def task_problem(args: argparse.Namespace) -> str | None:
    """The task must be one the harness ships, and its data directory must exist."""
    from harness.eval.lmeval import TASKS_DIR

    task = getattr(args, "task", "auto")
    known = sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))
    if task not in (None, "auto") and task not in known:
        return f"--task: unknown task {str(task)[:60]!r}; the harness ships {', '.join(known)}, or auto"
    data = getattr(args, "dataset_dir", None)
    if data is not None:
        path = Path(data)
        if not path.is_dir():
            return f"--dataset-dir {data!r} is not a directory"
        if not (path / "test.jsonl").is_file():
            return f"--dataset-dir {data!r} holds no test.jsonl"
    return None


def argument_problems(args: argparse.Namespace) -> list[str]:
    """Every problem of `args` a type cannot catch, one line each (empty: fine)."""
    problems: list[str] = []

    def add(problem: str | None) -> None:
        if problem:
            problems.append(problem)

    add(_number(args.startup_timeout, "--startup-timeout", low=0, high=MAX_STARTUP_TIMEOUT_S,
                low_open=True))
    for flag, value, low in (("--kv-cache-bytes", args.kv_cache_bytes, 1),
                             ("--num-fewshot", args.num_fewshot, 0),
                             ("--max-gen-toks", args.max_gen_toks, 1),
                             ("--limit", args.limit, 1), ("--max-questions", args.max_questions, 1),
                             ("--concurrency", args.concurrency, 1), ("--repeats", args.repeats, 1),
                             ("--chunked-prefill", getattr(args, "chunked_prefill", None), 1)):
        if value is not None:
            add(_number(value, flag, low=low, integer=True))
    add(_number(args.alpha, "--alpha", low=0, high=0.5, low_open=True))
    add(_number(args.margin, "--margin", low=0, high=100, low_open=True))
    problems += fault_problems(args)
    add(platform_problem(getattr(args, "platform", None)))
    add(kv_digest_hash_problem())
    keyword = getattr(args, "keyword", None)
    if keyword is not None and len(keyword) > MAX_KEYWORD_CHARS:
        add(f"-k expression of {len(keyword)} characters; at most {MAX_KEYWORD_CHARS}")
    for arg in getattr(args, "server_arg", None) or []:
        if len(arg) > MAX_ARG_CHARS or "\x00" in arg:
            add(f"--server-arg {arg[:40]!r}...: too long or holds a NUL byte")
    if args.junit_xml is not None:
        add(writable_file_problem(args.junit_xml, "--junit-xml"))
    add(writable_dir_problem(args.results_dir, "--results-dir"))
    if not getattr(args, "deployment", None):   # a deployment's preflight checks its task's data
        add(task_problem(args))
    for name in getattr(args, "allow_auth_env", None) or []:
        if not ENV_NAME.fullmatch(name):
            add(f"--allow-auth-env {name[:40]!r} is not an environment variable name")
    return problems


def kv_digest_hash_problem() -> str | None:
    """PD_ACCURACY_KV_DIGEST_HASH names a hash the digest plugin has (the servers inherit it)."""
    from harness.protocol.kv_digest import hash_choice

    try:
        hash_choice()
    except ValueError as exc:
        return str(exc)
    return None


def cell_problems(cells: Iterable) -> list[str]:
    """The names a cell's files and environment are built from: its id (a record's file name),
    its extra_env names and values."""
    problems = []
    for cell in cells:
        problem = safe_name_problem(cell.cell_id, "cell id")
        if problem:
            problems.append(problem)
            continue
        sizes = [(attr, getattr(cell, attr, 1)) for attr in
                 ("prefill_tp", "decode_tp", "num_prefill", "num_decode")]
        wrong = [(attr, v) for attr, v in sizes if not isinstance(v, int) or not 1 <= v <= MAX_GPUS]
        if wrong:   # one line per cell
            problems.append(f"cell {cell.cell_id[:80]}: {wrong[0][0]} {str(wrong[0][1])[:20]} is "
                            f"not 1 to {MAX_GPUS}")
            continue
        for key, value in getattr(cell, "extra_env", ()) or ():
            if not ENV_NAME.fullmatch(str(key)):
                problems.append(f"cell {cell.cell_id}: extra_env name {str(key)[:40]!r} is not an "
                                f"environment variable name")
            elif "\x00" in str(value) or len(str(value)) > MAX_ARG_CHARS:
                problems.append(f"cell {cell.cell_id}: extra_env {key}: value too long or "
                                f"holds a NUL byte")
    return problems


def random_weight_problems(models: Iterable[str], kv_digest: bool,
                           random_weights: Callable[[str], bool]) -> list[str]:
    """A model without weights (--load-format dummy) is judged on its KV digest: with
    --no-kv-digest nothing could pass, so the run is refused before a server starts."""
    if kv_digest:
        return []
    return [f"model {m} has no weights (--load-format dummy): its cells are judged on the "
            f"transfer proof, the exact bytes and the KV digest, and --no-kv-digest turns the "
            f"digest off" for m in dict.fromkeys(models) if random_weights(m)]


def print_problems(problems: Sequence[str], stream) -> None:
    from harness.core.redact import redact

    for line in problems:
        print(f"pd-accuracy: error: {redact(line)}", file=stream)


__all__ = ["add_trust_arguments", "argument_problems", "cell_problems", "print_problems"]
