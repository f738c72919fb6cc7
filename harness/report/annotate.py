"""Buildkite annotation: a markdown table of every cell's verdict in a results directory, and one
of its canaries (cells with an injected fault, CAUGHT or MISSED), kept out of the cells' table
and counts.

``annotate(results_dir, out_path)`` collects the records below `results_dir` (recursively; a
cell retried after an ERROR leaves several records, the newest one counts), renders
``templates/annotation.md.j2`` and writes it to `out_path`. Inside a Buildkite job (``BUILDKITE``
set and ``buildkite-agent`` on PATH) it also posts it with
``buildkite-agent annotate --style success|warning|error --context pd-accuracy``.

Status words only, no emoji: PASS, FAIL, ERROR, INCONCLUSIVE, XFAIL, XPASS, CAUGHT, MISSED.
The formatting helpers and `jinja_env` are shared with harness.report.
"""
from __future__ import annotations

import html
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from harness.core.outcomes import summary_line
from harness.core.redact import redact
from harness.report.evidence import Accuracy, accuracy_of, count, pct, pts
from harness.report.cell_ids import canary_result, canary_summary, fault_label, is_canary
# Worst first: tables are sorted by this, and the annotation style follows the worst present.
from harness.core.outcomes import DISPLAY_ORDER as OUTCOME_ORDER
from harness.core.outcomes import display_rank as outcome_rank
ERROR_OUTCOMES = frozenset({"FAIL", "MISSED", "ERROR"})
WARNING_OUTCOMES = frozenset({"XPASS", "INCONCLUSIVE"})
ANNOTATION_CONTEXT = "pd-accuracy"
# Buildkite rejects annotation bodies over 1 MiB; past this the table keeps only non-PASS rows.
MAX_ANNOTATION_BYTES = 900_000


# ---- formatting (shared with harness.report.html) --------------------------------------------------
def outcome_of(row: Mapping[str, Any]) -> str:
    """A record's (or history row's) outcome, falling back to its status."""
    verdict = row.get("verdict") if isinstance(row.get("verdict"), Mapping) else row
    return str(verdict.get("outcome") or verdict.get("status") or "ERROR")


def fmt_acc(value: Any) -> str:
    """An accuracy as a percentage ("88.0 %")."""
    return pct(value)


def fmt_delta(delta: Any, lo: Any = None, hi: Any = None) -> str:
    """A delta of accuracies in points, with its interval when given: "-12.0 [-24.0, -4.0] pts"."""
    if delta is None:
        return "-"
    text = pts(delta)
    if lo is not None and hi is not None:
        text += f" [{pts(lo)}, {pts(hi)}]"
    return text + " pts"


def fmt_p(value: Any) -> str:
    if value is None:
        return "-"
    value = float(value)
    return f"{value:.3f}" if value >= 0.001 else f"{value:.1e}"


def fmt_bytes(value: Any) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def transfer_summary(metrics: Mapping[str, Any] | None,
                     checks: Sequence[Mapping[str, Any]] = ()) -> str:
    """One line of transfer proof: external prompt tokens, the connector's bytes, failures, the
    check; counts as integers ("22997/22997 prompt tokens external")."""
    transfer = (metrics or {}).get("transfer") or {}
    check = next((c for c in checks or () if c.get("name") == "transfer"), None)
    parts = []
    if transfer:
        external, total = transfer.get("prompt_tokens_external"), transfer.get("prompt_tokens_total")
        if external is not None:
            parts.append(f"{count(external)}/{count(total) if total is not None else '?'} "
                         f"prompt tokens external")
        if transfer.get("kv_bytes") is not None:
            parts.append(f"{fmt_bytes(transfer['kv_bytes'])} through the connector")
        failed = transfer.get("failed_transfers")
        if failed is not None:
            parts.append(f"{count(failed)} failed transfers")
    if check is not None:
        parts.append(f"check {'passed' if check.get('passed') else 'FAILED'}")
    return ", ".join(parts) if parts else "no transfer data"


def md_cell(text: Any) -> str:
    """`text` safe inside a markdown table cell: redacted, HTML-escaped (Buildkite renders the
    markdown's HTML, and a reason may quote an external endpoint's error page), on one line."""
    return html.escape(redact(text)).replace("|", "\\|").replace("\n", " ").strip()


def brief(text: Any, chars: int = 200) -> str:
    """A long note (a declared expected failure's) cut at a word boundary; the matrix keeps it."""
    import textwrap

    return textwrap.shorten(str(text or ""), width=chars, placeholder=" … (whole note: the matrix)",
                            break_on_hyphens=False)


def jinja_env():
    """The jinja2 environment for harness/report/templates, with the formatting filters."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("harness.report", "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "html.j2")),
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(acc=fmt_acc, delta=fmt_delta, pvalue=fmt_p, bytes=fmt_bytes, md=md_cell,
                       points=pts, count=count, brief=brief)
    return env


# ---- records ----------------------------------------------------------------------------------
@dataclass
class CellResult:
    """The newest record of one cell in a results directory, ready to render."""

    cell_id: str
    outcome: str
    status: str
    reason: str
    expected_failure: str | None
    metrics: Mapping[str, Any]
    transfer: str
    attempts: int
    links: list[tuple[str, str]] = field(default_factory=list)   # (name, url)
    fault: str | None = None       # a canary's fault, e.g. "corrupt-block (last)"; None: a real cell
    accuracy: Accuracy | None = None   # the numbers and interval the verdict used, in points

    @property
    def rank(self) -> int:
        return outcome_rank(self.outcome)


def latest_per_cell(records: Iterable[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], int]]:
    """(newest record, number of records) per cell id, in first-seen order."""
    by_cell: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        by_cell.setdefault(record["cell"]["id"], []).append(record)
    return [(max(rs, key=lambda r: (r.get("created_at") or "", r.get("run_id") or "")), len(rs))
            for rs in by_cell.values()]


def artifact_files(record: Mapping[str, Any]) -> list[tuple[str, Path]]:
    """(name, path) of the record itself and of its log/sample artifacts that exist."""
    if not record.get("_path"):
        return []
    record_path = Path(record["_path"])
    files = [("record", record_path)]
    artifacts = record.get("artifacts") or {}
    named = [(name, rel) for name, rel in (artifacts.get("logs") or {}).items()]
    named += [(name.replace("_", " "), artifacts.get(name))
              for name in ("baseline_samples", "pd_samples", "proxy_records")]
    for name, rel in named:
        if not rel:
            continue
        path = Path(rel) if Path(rel).is_absolute() else record_path.parent / rel
        if path.exists():
            files.append((name, path))
    return files


def _link(path: Path, *, base: Path, artifact_root: Path | None) -> str:
    if artifact_root is not None:
        # Buildkite resolves artifact:// against the paths the jobs uploaded, which are
        # relative to the checkout root the annotate step runs in.
        return "artifact://" + os.path.relpath(path.resolve(), artifact_root.resolve())
    return os.path.relpath(path.resolve(), base.resolve())


def cell_results(records: Iterable[Mapping[str, Any]], *, link_base: Path = Path("."),
                 artifact_root: Path | None = None) -> list[CellResult]:
    """One CellResult per cell (its newest record), worst outcome first."""
    out = []
    for record, attempts in latest_per_cell(records):
        verdict = record.get("verdict") or {}
        metrics = record.get("metrics") or {}
        cell_id = record["cell"]["id"]
        status, reason = str(verdict.get("status") or "ERROR"), str(verdict.get("reason") or "")
        outcome, fault = outcome_of(record), record["cell"].get("fault") or verdict.get("canary")
        if fault or is_canary(cell_id):
            outcome = canary_result(cell_id, fault, status, outcome, reason)
            fault = fault_label(cell_id, fault)
        out.append(CellResult(
            cell_id=cell_id,
            outcome=outcome,
            status=status,
            reason=reason,
            expected_failure=verdict.get("expected_failure") or record["cell"].get("expected_failure"),
            metrics=metrics,
            transfer=transfer_summary(metrics, verdict.get("checks") or ()),
            attempts=attempts,
            links=[(name, _link(p, base=link_base, artifact_root=artifact_root))
                   for name, p in artifact_files(record)],
            fault=fault,
            accuracy=accuracy_of(record),
        ))
    out.sort(key=lambda c: (c.rank, c.cell_id))
    return out


def annotation_style(results: Sequence[CellResult]) -> str:
    """error if any FAIL/MISSED/ERROR, warning if any XPASS/INCONCLUSIVE or no cells, else
    success (canaries included: a CAUGHT one is a success)."""
    outcomes = {r.outcome for r in results}
    if outcomes & ERROR_OUTCOMES:
        return "error"
    if not results or outcomes & WARNING_OUTCOMES:
        return "warning"
    return "success"


def outcome_counts(results: Sequence[CellResult]) -> list[tuple[str, int]]:
    counts = {o: sum(1 for r in results if r.outcome == o) for o in OUTCOME_ORDER}
    extra = sorted({r.outcome for r in results} - set(OUTCOME_ORDER))
    counts.update({o: sum(1 for r in results if r.outcome == o) for o in extra})
    return [(o, n) for o, n in counts.items() if n]


def render_markdown(records: Iterable[Mapping[str, Any]], *, title: str = "P/D accuracy",
                    link_base: Path = Path("."), artifact_root: Path | None = None) -> str:
    """The annotation markdown for `records` (see module docstring)."""
    everything = cell_results(records, link_base=link_base, artifact_root=artifact_root)
    results = [r for r in everything if r.fault is None]
    canaries = [r for r in everything if r.fault is not None]
    template = jinja_env().get_template("annotation.md.j2")
    context = dict(title=title, results=results, counts=outcome_counts(results),
                   summary=summary_line(r.outcome for r in everything),
                   canaries=canaries, canary_count=canary_summary([r.outcome for r in canaries]),
                   style=annotation_style(everything), truncated=0)
    text = template.render(rows=results, **context)
    if len(text.encode()) > MAX_ANNOTATION_BYTES:   # canary rows are few: they all stay
        rows = [r for r in results if r.outcome != "PASS"]
        context["truncated"] = len(results) - len(rows)
        text = template.render(rows=rows, **context)
    return text


@dataclass(frozen=True)
class AnnotationResult:
    path: Path
    style: str
    posted: bool
    cells: int          # every cell, canaries included
    summary: str = ""   # "11 cells: 4 PASS, 1 XFAIL, 6 canaries caught", as `run` ends


def _in_buildkite() -> bool:
    return bool(os.environ.get("BUILDKITE")) and shutil.which("buildkite-agent") is not None


def annotate(results_dir: str | os.PathLike[str], out_path: str | os.PathLike[str],
             agent: bool | str = "auto", *, context: str = ANNOTATION_CONTEXT) -> AnnotationResult:
    """Render the annotation of `results_dir` to `out_path`; post it to Buildkite when `agent`
    is True, or "auto" and this runs in a Buildkite job. Raises CalledProcessError when
    ``buildkite-agent annotate`` fails (the markdown file is written first)."""
    from harness.run.record import load_records

    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise FileNotFoundError(f"results directory {results_dir} does not exist")
    records = load_records(results_dir)
    post = _in_buildkite() if agent == "auto" else bool(agent)
    out = Path(out_path)
    markdown = render_markdown(records, link_base=out.parent,
                               artifact_root=Path.cwd() if post else None)
    from harness.core.atomic import atomic_write_text

    atomic_write_text(out, markdown)
    results = cell_results(records)
    style = annotation_style(results)
    if post:
        subprocess.run(["buildkite-agent", "annotate", "--style", style, "--context", context],
                       input=markdown, text=True, check=True)
    return AnnotationResult(out, style, post, len(results),
                            summary_line(r.outcome for r in results))


__all__ = ["AnnotationResult", "CellResult", "OUTCOME_ORDER", "annotate", "annotation_style",
           "cell_results", "fmt_acc", "fmt_bytes", "fmt_delta", "fmt_p", "jinja_env",
           "latest_per_cell", "outcome_counts", "outcome_of", "outcome_rank", "render_markdown",
           "transfer_summary"]
