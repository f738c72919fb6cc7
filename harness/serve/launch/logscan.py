"""Which lines of a server's log explain its failure: pure functions over the log text.

Tuned on vLLM logs (its per-process prefixes, one-record-per-line tracebacks, the harmless
warnings every healthy start prints, the C++ abort boilerplate after the real error), but
nothing here knows about processes: give it text, get lines. What a KV connector's own lines
mean comes from its module (``KvConnector.log``, every driven connector's at once).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from harness.connectors import log_patterns

__all__ = ["decisive_error_lines", "most_decisive_line"]


# vLLM prefixes lines of its child processes, e.g. "(EngineCore_DP0 pid=1234) ERROR ...".
_PROCESS_PREFIX_RE = re.compile(r"^\([^()]*\bpid=\d+\)\s?")
# Routine log records: an INFO line that mentions a connector or "error_rate" is not a failure.
# Covers vLLM ("INFO 11-29 19:22:01 [x.py:1] ..."), a connector's own Python logger
# ("2026-11-29 19:22:01 <name> INFO ...") and glog-style C++ lines ("I1129 19:22:01.123 ...").
_ROUTINE_LEVEL_RE = re.compile(r"^.{0,64}?\b(?:INFO|DEBUG|TRACE)\b|^[ID]\d{4} \d\d:\d\d:\d\d")
# Lines that look like errors but are known to be harmless, logged by every healthy start of vLLM
# on an offline GPU host (docs/gpu.md): a connector's optional extension (its LogPatterns), FlashInfer's
# cubin download, the fd-limit notice. Never decisive: a server that times out in start-up is
# then described by its last log lines (where it was), not by one of these.
_HARMLESS = (r"Failed to connect to NVIDIA artifactory|Found ulimit of \d+ and failed to "
             r"automatically")
_ERROR_LOOKING = (r"Error|Exception|CUDA out of memory|\bERROR\b|\bCRITICAL\b|\bFATAL\b|\berror:"
                  r"|Segmentation fault|core dumped|Killed\b|Aborted\b|^[EF]\d{4} \d\d:\d\d:\d\d")
# vLLM's own statement of a worker's root cause; when present it is the line to show (and a
# connector's, its LogPatterns.root_cause)
_ROOT_CAUSE = r"Worker failed with error "


def _with(base: str, kind: str) -> re.Pattern[str]:
    extra = log_patterns(kind)
    return re.compile(f"{base}|{extra}" if extra else base)


@lru_cache(maxsize=None)
def _harmless_re() -> re.Pattern[str]:
    return _with(_HARMLESS, "harmless")


@lru_cache(maxsize=None)
def _error_looking_re() -> re.Pattern[str]:
    return _with(_ERROR_LOOKING, "error_word")


@lru_cache(maxsize=None)
def _root_cause_re() -> re.Pattern[str]:
    return _with(_ROOT_CAUSE, "root_cause")


# Wrapper messages that only point elsewhere; the line that *caused* them is more decisive.
_GENERIC_WRAPPER_RE = re.compile(
    r"See root cause above|See stack trace \(above\)|Engine core initialization failed"
    r"|initialization failed\.?$|^=== |output_handler failed|EngineDeadError"
    r"|^SystemExit\b|^KeyboardInterrupt\b"
)


# What a C++ abort prints after the real error (std::terminate boilerplate, c10's "Exception
# raised from <destructor>" trailer, CUDA's advice lines) can push the cause out of the last
# lines shown (docs/gpu.md).
_ABORT_TRAILER_RE = re.compile(
    r"^terminate called after throwing|^\s*what\(\):|^Search for `cuda"
    r"|^Exception raised from \S+ at |^CUDA kernel errors might be asynchronously reported"
    r"|^For debugging consider passing CUDA_LAUNCH_BLOCKING|^Compile with `TORCH_USE_CUDA_DSA`"
)
def _strip_process_prefix(line: str) -> str:
    """``line`` without vLLM's "(EngineCore_DP0 pid=1234) " child-process prefix."""
    return _PROCESS_PREFIX_RE.sub("", line, count=1)


# vLLM logs a traceback one record per line ("ERROR 11-29 21:11:59 [core.py:1332]   File ...");
# strip that record prefix so the traceback logic below sees the plain lines.
_VLLM_RECORD_PREFIX_RE = re.compile(
    r"^(?:ERROR|WARNING|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]+\] ?")
_STACK_NOISE_RE = re.compile(r"^\s*(?:frame #\d+:|File \"|\^+\s*$)")


def decisive_error_lines(log_text: str, limit: int = 5) -> list[str]:
    """Return the last ``limit`` error-looking lines of a server log, in log order.

    Error-looking: the final line of each Python traceback (``KeyError: 'x'``), and any line that
    is not a routine INFO/DEBUG record and mentions Error, Exception, ERROR, ``error:`` (argparse),
    "CUDA out of memory", a connector's own error word, FATAL/CRITICAL, or a fatal
    signal. Repeated identical lines (the
    same error printed by every worker) count once. When nothing looks like an error, the last 10
    non-empty lines are returned instead, so a caller always has something to show.
    """
    raw_lines = [line.rstrip() for line in log_text.splitlines()]
    picked: list[str] = []
    in_traceback = False
    for raw in raw_lines:
        plain = _strip_process_prefix(raw)
        body = _VLLM_RECORD_PREFIX_RE.sub("", plain, count=1)
        if not body.strip() or _STACK_NOISE_RE.match(body):
            continue  # C++ frames ("frame #3: ...") and traceback frames logged line by line
        if body.startswith("Traceback (most recent call last):"):
            in_traceback = True
            continue
        if in_traceback:
            if body[:1].isspace():
                continue  # a frame ("  File ...") or its source line
            in_traceback = False
            if not _harmless_re().search(body):
                picked.append(raw)  # the exception line that ends the traceback
            continue
        if (_ROUTINE_LEVEL_RE.match(plain) or _harmless_re().search(plain)
                or _ABORT_TRAILER_RE.match(body)):
            continue
        if _error_looking_re().search(plain):
            picked.append(raw)
    if not picked:
        return [line for line in raw_lines if line.strip()][-10:]
    # Dedupe by content (ignoring the per-process prefix), keeping each line's last occurrence.
    last_index = {_strip_process_prefix(line): i for i, line in enumerate(picked)}
    unique = [line for i, line in enumerate(picked) if last_index[_strip_process_prefix(line)] == i]
    return unique[-limit:] if limit > 0 else []


def most_decisive_line(lines: Sequence[str]) -> str:
    """Pick the single line to show in a one-line error: vLLM's "Worker failed with error ..."
    when present (what came after it is the workers' teardown), else the last line that is not a
    generic wrapper such as vLLM's "Engine core initialization failed. See root cause above."."""
    for line in reversed(lines):
        if _root_cause_re().search(line):
            return line.strip()
    for line in reversed(lines):
        if not _GENERIC_WRAPPER_RE.search(_strip_process_prefix(line).strip()):
            return line.strip()
    return lines[-1].strip() if lines else ""

