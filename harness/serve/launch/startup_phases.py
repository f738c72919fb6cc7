"""Where a vLLM server's start-up went, read from its log: the harness's own `=== <time> start`
header, then vLLM's timestamped milestones (one-second resolution; vLLM prints month-day and
time, the year comes from the header).

    imports        launch → the API server's first log line (Python + torch + vLLM imports)
    api_config     → the engine core's "Initializing a V1 LLM engine" (arguments, model config,
                     tokenizer, spawning the engine core process and its imports)
    engine_init    → a worker's "Starting to load model" (executor, worker processes, distributed
                     init, connector agent)
    weights        → "Loading weights took" / "Model loading took"
    compile        → "Warming up done" (CPU) / the last of "torch.compile takes", "Graph capturing
                     finished" (CUDA): torch.compile, Inductor, CUDA graphs, FlashInfer JIT
    kv_cache       → "init engine (profile, create kv cache, warmup model) took"
    ready          → "Starting vLLM server on" / "Available routes are" (HTTP up)

A milestone missing from a log (an eager server has no compile) folds its time into the phase
before it; `unaccounted_s` keeps the totals honest. Hand-written because no library reads vLLM's
log; the patterns are the strings vLLM 0.26 (CUDA) and 0.32 (CPU) print.
"""
from __future__ import annotations

import gzip
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Iterable, Sequence

HEADER_RE = re.compile(r"^=== (\d{4})-(\d\d-\d\dT\d\d:\d\d:\d\d) start (\S+?):")
STAMP_RE = re.compile(r"^\((\w+) pid=\d+\) (?:INFO|WARNING|DEBUG|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d)")
# (phase that ENDS at this milestone, pattern); order = order in a start-up
MILESTONES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("imports", re.compile(r"^\(APIServer pid=")),
    ("api_config", re.compile(r"Initializing a V1 LLM engine")),
    ("engine_init", re.compile(r"Starting to load model")),
    ("weights", re.compile(r"Loading weights took|Model loading took")),
    ("compile", re.compile(r"Warming up done|torch\.compile takes|Graph capturing finished")),
    ("kv_cache", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
    ("ready", re.compile(r"Starting vLLM server on|Available routes are")),
)
PHASES = tuple(name for name, _ in MILESTONES)


@dataclass(frozen=True)
class StartupPhases:
    server: str
    log_path: str
    phases: dict[str, float] = field(default_factory=dict)   # seconds per phase seen
    total_s: float | None = None                              # launch → ready; None: never ready

    @property
    def unaccounted_s(self) -> float:
        return 0.0 if self.total_s is None else self.total_s - sum(self.phases.values())


def parse_startup(text: str, server: str = "", log_path: str = "") -> StartupPhases | None:
    """Phases of the LAST start-up in `text` (a log may hold several attempts); None without a
    harness header."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if HEADER_RE.match(line)]
    if not starts:
        return None
    head = HEADER_RE.match(lines[starts[-1]])
    year = head.group(1)
    launched = datetime.strptime(f"{year}-{head.group(2)}", "%Y-%m-%dT%H:%M:%S")
    server = server or head.group(3)
    reached: dict[str, datetime] = {}
    for line in lines[starts[-1] + 1:]:
        stamp = STAMP_RE.match(line)
        if not stamp:
            continue
        when = datetime.strptime(f"{year}-{stamp.group(2)}", "%Y-%m-%d %H:%M:%S")
        for name, pattern in MILESTONES:
            if pattern.search(line):
                # compile: the last of its markers counts (CUDA prints two); others: the first
                if name == "compile" or name not in reached:
                    reached[name] = when
        if "ready" in reached:
            break
    phases: dict[str, float] = {}
    previous = launched
    for name in PHASES:
        if name in reached and reached[name] >= previous:
            phases[name] = (reached[name] - previous).total_seconds()
            previous = reached[name]
    total = (reached["ready"] - launched).total_seconds() if "ready" in reached else None
    return StartupPhases(server, log_path, phases, total)


def _read_log(path: Path) -> str:
    """A server log as text; committed reference runs keep theirs gzipped (`scripts/gpu/keep.py`)."""
    if path.suffix == ".gz":
        with gzip.open(path, "rt", errors="replace") as fh:
            return fh.read()
    return path.read_text(errors="replace")


def parse_logs(paths: Iterable[str | Path]) -> list[StartupPhases]:
    out = []
    for path in paths:
        path = Path(path)
        parsed = parse_startup(_read_log(path), log_path=str(path))
        if parsed is not None:
            out.append(parsed)
    return out


def summed(items: Sequence[StartupPhases]) -> dict[str, float]:
    """Seconds per phase over every server (server-seconds, not wall time)."""
    total = {name: 0.0 for name in PHASES}
    for item in items:
        for name, seconds in item.phases.items():
            total[name] += seconds
    return total
