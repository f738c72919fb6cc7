"""The checks of a run's input that no option type can make alone (harness.cli.values makes
those): where files may be written, the task's data, the names a cell's files and environment
are built from (cell ids, extra_env), GPU counts, and models without weights. Each problem is
one line; harness.cli.front_door runs them before anything starts.
"""
from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from harness.core.safe_paths import safe_name_problem

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_GPUS = 1024
MAX_ARG_CHARS = 4096


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
        bad = False
        for key, value in getattr(cell, "extra_env", ()) or ():
            if not ENV_NAME.fullmatch(str(key)):
                problems.append(f"cell {cell.cell_id}: extra_env name {str(key)[:40]!r} is not an "
                                f"environment variable name")
                bad = True
            elif "\x00" in str(value) or len(str(value)) > MAX_ARG_CHARS:
                problems.append(f"cell {cell.cell_id}: extra_env {key}: value too long or "
                                f"holds a NUL byte")
                bad = True
        if not bad:   # the variables its servers would parse, parsed now
            from harness.cli.inputs import extra_env_problems
            problems += extra_env_problems(cell.cell_id, getattr(cell, "extra_env", ()) or ())
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


__all__ = ["cell_problems", "print_problems", "task_problem"]
