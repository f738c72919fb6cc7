"""What `pd-accuracy run` prints at its end, and the copy of its console kept in the run folder.

The verdict table (`print_table`) has one row per cell: outcome, the cell id (always whole, on
one line: a person copies it into `--only`), the accuracies, the delta in points with the
interval the verdict used (harness.report.evidence), n and the reason, wrapped at word
boundaries. It is as wide as the terminal, or LOG_WIDTH columns in a log, and wider only when
the longest cell id needs it; a reason is shortened at a word boundary (the record keeps it
whole). rich draws it (its tables measure and wrap text by words).

`start_console_log()` tees the process's stdout and stderr from the start of a run;
`save_console_log(run_dir)` writes what was printed to ``run_dir/console.log``. Progress bars
(lm-eval's tqdm bars on stderr) never reach that copy, and reach the real stream only when it is
a terminal, where they redraw in place; in a log they would be hundreds of lines of noise.
"""
from __future__ import annotations

import io
import os
import re
import shutil
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from harness.core.outcomes import display_rank
from harness.core.redact import redact
from harness.report.evidence import VERDICT, accuracy_of, confidence_text, pct, pts

LOG_WIDTH = 160          # columns of the table when stdout is not a terminal
REASON_CHARS = 240       # a reason longer than this is shortened at a word boundary
LONG_WORD = 32           # a longer token (a request id) is cut: "pdacc-wx.late-read.4000.483d8f7…"
CONSOLE_LOG = "console.log"
# a tqdm frame: "\r 34%|███▍      | 17/50 [00:01<00:03, 10.78it/s]" (or its cursor moves)
PROGRESS = re.compile(r"\r|\x1b\[A|\d+%\|.*\|")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# on a terminal only; the words carry the meaning (a log has no colour)
OUTCOME_STYLES = {"PASS": "bold green", "FAIL": "bold red", "MISSED": "bold red",
                  "ERROR": "bold magenta", "XPASS": "bold yellow", "INCONCLUSIVE": "bold yellow",
                  "XFAIL": "bold cyan", "CAUGHT": "bold blue"}


# ---- the table ---------------------------------------------------------------------------------
def short_reason(reason: str, chars: int = REASON_CHARS) -> str:
    """`reason` on one line, at most `chars` long, cut at a word boundary ("…" where cut); a
    token longer than LONG_WORD (a request id) keeps its head: the table never folds a word."""
    words = [w if len(w) <= LONG_WORD else w[:LONG_WORD - 1] + "…" for w in redact(reason).split()]
    return textwrap.shorten(" ".join(words), width=chars, placeholder=" …",
                            break_on_hyphens=False)


def table_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """One row per record, worst outcome first (FAIL, MISSED, ERROR, ... PASS): outcome, cell,
    delta, interval (the verdict's), confidence, n, baseline, pd and the shortened reason."""
    rows = []
    for record in records:
        verdict = record.get("verdict") or {}
        acc = accuracy_of(record)
        has_interval = acc.lo is not None and acc.hi is not None
        rows.append({
            "outcome": str(verdict.get("outcome") or verdict.get("status") or "ERROR"),
            "cell": str((record.get("cell") or {}).get("id")),
            "delta": pts(acc.delta),
            "interval": f"[{pts(acc.lo)}, {pts(acc.hi)}]" if has_interval else "",
            "confidence": (confidence_text(acc.confidence) + ("" if acc.source == VERDICT else " *")
                           if has_interval else ""),
            "n": "-" if acc.n is None else str(acc.n),
            "accuracies": f"{pct(acc.baseline)} → {pct(acc.pd)}",
            "reason": short_reason(str(verdict.get("reason") or "")),
        })
    return sorted(rows, key=lambda row: display_rank(row["outcome"]))


# outcome | the cell id, its reason below it | Δ, its interval and confidence, both accuracies | n
COLUMNS = ("outcome", "cell / why", "Δ pts [interval]", "n")
NUMBERS_WIDTH = 22        # "-98.0 [-100.0, -89.0]"


def table_width(rows: Sequence[Mapping[str, str]], available: int) -> int:
    """`available`, or more when the outcome, the whole longest id and the numbers do not fit
    in it (each column costs 3 columns of padding and rule)."""
    outcome = max([len(COLUMNS[0])] + [len(r["outcome"]) for r in rows])
    cell = max([len(COLUMNS[1])] + [len(r["cell"]) for r in rows])
    n = max([1] + [len(r["n"]) for r in rows])
    return max(available, outcome + cell + NUMBERS_WIDTH + n + 3 * len(COLUMNS) + 1)


def available_width(stream: Any = None) -> int:
    stream = stream or sys.stdout
    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    isatty = getattr(stream, "isatty", lambda: False)
    return shutil.get_terminal_size((LOG_WIDTH, 24)).columns if isatty() else LOG_WIDTH


LEGEND = ("Δ pts: P/D accuracy minus the baseline's, in points, with the interval the verdict "
          "used and its confidence (its lower end is the bound of the drop held to the margin); "
          "* a 95 % descriptive interval, where the verdict did not rest on accuracy; below it "
          "the baseline's and P/D's accuracy. Whole reasons: each cell's record "
          "(<run folder>/<cell>.json).")


def render_table(records: Sequence[Mapping[str, Any]], width: int, color: bool = False) -> str:
    """The verdict table of `records` as text, `width` columns (or wider: table_width). Every
    cell is rich Text: a "[kv-digest]" in a reason is text, never markup."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    rows = table_rows(records)
    width = table_width(rows, width)
    longest = max([len(COLUMNS[1])] + [len(r["cell"]) for r in rows])
    table = Table(title="pd-accuracy verdicts", title_justify="left", box=box.SQUARE,
                  show_lines=True)
    table.add_column(Text(COLUMNS[0]), no_wrap=True)
    table.add_column(Text(COLUMNS[1]), min_width=longest, ratio=1, overflow="fold")
    table.add_column(Text(COLUMNS[2]), no_wrap=True, min_width=NUMBERS_WIDTH)
    table.add_column(Text(COLUMNS[3]), no_wrap=True, justify="right")
    for r in rows:
        numbers = "\n".join(x for x in (f"{r['delta']} {r['interval']}".strip(), r["confidence"],
                                         r["accuracies"]) if x)
        table.add_row(Text(r["outcome"], style=OUTCOME_STYLES.get(r["outcome"], "")),
                      Text(f"{r['cell']}\n{r['reason']}"), Text(numbers), Text(r["n"]))
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=color, no_color=not color, highlight=False,
            soft_wrap=False).print(table)
    text = "".join(line.rstrip() + "\n" for line in out.getvalue().splitlines())
    return text + "\n".join(textwrap.wrap(LEGEND, min(width, 100))) + "\n"


def print_table(results: Sequence[Any], stream: Any = None) -> None:
    """Print the verdict table of a run's results (objects with a `.record`) to `stream`."""
    stream = stream or sys.stdout
    isatty = getattr(stream, "isatty", lambda: False)()
    stream.write(render_table([r.record for r in results], available_width(stream), color=isatty))
    stream.flush()


# ---- the console copy --------------------------------------------------------------------------
class _Tee(io.TextIOBase):
    """A text stream that writes through to `real` and keeps a copy in `log` (a list), without
    progress-bar frames; frames reach `real` only when it is a terminal."""

    def __init__(self, real: Any, log: list[str]) -> None:
        self.real, self.log = real, log
        self._thread = threading.local()    # bars of two threads (the A/A re-run's) interleave

    def write(self, text: str) -> int:
        frame = bool(PROGRESS.search(text))
        # tqdm ends a bar with a lone "\n" after its last frame, in the bar's thread
        after_frame = getattr(self._thread, "after_frame", False)
        bar_end = after_frame and text == "\n"
        self._thread.after_frame = frame or (after_frame and text == "")
        if frame or bar_end:
            if self.isatty():
                self.real.write(text)
            return len(text)
        self.log.append(ANSI.sub("", text))
        return self.real.write(text)

    def flush(self) -> None:
        self.real.flush()

    def isatty(self) -> bool:
        return bool(getattr(self.real, "isatty", lambda: False)())

    def fileno(self) -> int:
        return self.real.fileno()

    @property
    def encoding(self) -> str:   # type: ignore[override]
        return getattr(self.real, "encoding", "utf-8")


_LOG: list[str] = []


def start_console_log() -> None:
    """Tee stdout and stderr from here on (again from empty when called again)."""
    _LOG.clear()
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _Tee):
            stream = stream.real
        setattr(sys, name, _Tee(stream, _LOG))


def stop_console_log() -> None:
    """Give stdout and stderr back their own streams."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _Tee):
            setattr(sys, name, stream.real)


def save_console_log(run_dir: str | os.PathLike[str]) -> Path | None:
    """Write what was printed since start_console_log() to run_dir/console.log (None: nothing
    was teed)."""
    if not isinstance(sys.stdout, _Tee):
        return None
    sys.stdout.flush()
    path = Path(run_dir) / CONSOLE_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(_LOG))
    return path


__all__ = ["CONSOLE_LOG", "COLUMNS", "LOG_WIDTH", "available_width", "print_table",
           "render_table", "save_console_log", "short_reason", "start_console_log",
           "stop_console_log", "table_rows", "table_width"]
