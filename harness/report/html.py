"""Static HTML report from the history store: heatmaps, trends, regressions, every cell.

``render_report(history_db, out_dir)`` writes ``out_dir/index.html`` (templates/report.html.j2)
and its PNGs under ``out_dir/img/``:

* one heatmap per model: rows are runner x backend, columns are the rest of the configuration
  (blocks, TP and every variant: "p128d128 tp1x2", "p128d128 tp1x1 eager"), so each square is
  exactly one cell, coloured by its newest verdict and labelled with its accuracy delta;
* the canaries (cells with an injected fault): their own table, CAUGHT or MISSED, never in the
  heatmaps, the counts or the table of cells;
* one trend plot per real cell with at least two entries (accuracy delta with its CI, and both
  accuracies, per run); the cells that changed come first, at most `max_trend_plots`;
* "changes since the previous run": for each cell, its newest entry against the one before it
  (per cell, because one nightly build holds many harness runs): new FAIL, newly ERROR, new
  XPASS, newly MISSED (a canary), recovered, and (when none of those applies, and not for a
  canary) significant drift of the delta — the two deltas' CIs do not overlap, or, without CIs,
  they differ by more than the larger MDE;
* a table of every real cell's newest entry, worst first.

Rows of canaries recorded before CAUGHT/MISSED existed (outcome FAIL) are judged as canaries
here (harness.report.cell_ids.with_canary_outcome).
"""
from __future__ import annotations

import json
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from harness.report.annotate import OUTCOME_ORDER, fmt_delta, jinja_env, outcome_rank
from harness.report.cell_ids import (canary_summary, fault_label, is_canary, variant_of,
                                     variant_sort_key, with_canary_outcome)
from harness.report.history import load_cells, load_runs
from harness.protocol.effective_config import summary as effective_summary

OUTCOME_COLOURS = {
    "PASS": "#43a047", "XFAIL": "#a5d6a7", "INCONCLUSIVE": "#fdd835", "XPASS": "#fb8c00",
    "FAIL": "#e53935", "ERROR": "#8e24aa", "CAUGHT": "#90caf9", "MISSED": "#b71c1c",
}
MISSING_COLOUR = "#eeeeee"
# a cell its vLLM release cannot run (harness.run.record.NOT_APPLICABLE_OUTCOME): never started
NOT_APPLICABLE = "N/A"
NOT_APPLICABLE_COLOUR = "#9e9e9e"
DEFAULT_MAX_TREND_PLOTS = 150


def _outcome(row: Mapping[str, Any]) -> str:
    return str(row.get("outcome") or row.get("status") or "ERROR")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


# ---- comparisons ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Change:
    """How one cell's newest entry differs from its previous one."""

    kind: str          # "new FAIL" | "newly ERROR" | "newly MISSED" | "new XPASS" | "drift" | "recovered"
    cell_id: str
    previous: Mapping[str, Any]
    latest: Mapping[str, Any]
    detail: str

    @property
    def is_regression(self) -> bool:
        return self.kind != "recovered"


def delta_drifted(previous: Mapping[str, Any], latest: Mapping[str, Any]) -> bool:
    """Whether the accuracy delta moved significantly between two entries of one cell."""
    if previous.get("delta") is None or latest.get("delta") is None:
        return False
    cis = (previous.get("ci_lo"), previous.get("ci_hi"), latest.get("ci_lo"), latest.get("ci_hi"))
    if None not in cis:
        p_lo, p_hi, l_lo, l_hi = (float(v) for v in cis)
        return l_hi < p_lo or l_lo > p_hi
    mdes = [float(m) for m in (previous.get("mde"), latest.get("mde")) if m is not None]
    return bool(mdes) and abs(float(latest["delta"]) - float(previous["delta"])) > max(mdes)


def compare(previous: Mapping[str, Any], latest: Mapping[str, Any]) -> list[Change]:
    """The changes between two entries (oldest first) of one cell."""
    cell_id = str(latest["cell_id"])
    before, now = _outcome(previous), _outcome(latest)
    changes = []
    for kind, target in (("new FAIL", "FAIL"), ("newly ERROR", "ERROR"),
                         ("newly MISSED", "MISSED"), ("new XPASS", "XPASS")):
        if now == target and before != target:
            changes.append(Change(kind, cell_id, previous, latest,
                                  f"{before} -> {now}: {latest.get('reason') or ''}".strip()))
    if before in ("FAIL", "ERROR", "MISSED") and now in ("PASS", "XFAIL", "CAUGHT"):
        changes.append(Change("recovered", cell_id, previous, latest, f"{before} -> {now}"))
    # A new FAIL or a recovery already says the delta moved; drift reports the silent moves.
    # A canary's delta is the fault's damage, not the P/D path's accuracy: it has no drift.
    if not changes and not is_canary(cell_id) and delta_drifted(previous, latest):
        changes.append(Change(
            "drift", cell_id, previous, latest,
            f"delta {fmt_delta(previous['delta'], previous.get('ci_lo'), previous.get('ci_hi'))}"
            f" -> {fmt_delta(latest['delta'], latest.get('ci_lo'), latest.get('ci_hi'))}"))
    return changes


def history_by_cell(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Rows per cell id, oldest first (rows come from history.load_cells, already ordered)."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        out.setdefault(str(row["cell_id"]), []).append(row)
    return out


def changes_since_previous(rows: Sequence[Mapping[str, Any]]) -> list[Change]:
    """Every cell's changes between its last two entries, regressions first."""
    changes = []
    for entries in history_by_cell(rows).values():
        if len(entries) >= 2:
            changes += compare(entries[-2], entries[-1])
    order = ["new FAIL", "newly ERROR", "newly MISSED", "drift", "new XPASS", "recovered"]
    return sorted(changes, key=lambda c: (order.index(c.kind), c.cell_id))


# ---- plots ------------------------------------------------------------------------------------
def _figure(width: float, height: float):
    from matplotlib.figure import Figure   # no pyplot: no global state, no GUI backend

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _square(row: Mapping[str, Any]) -> tuple[str, str]:
    """(row, column) of one cell: "runner backend" and its variant; a deployment the harness did
    not start (`run --deployment`) has neither, so it gets the row "external" and its own name."""
    if row.get("runner") is None and row.get("backend") is None:
        return "external", str(row["cell_id"]).removeprefix("external-")
    return f"{row['runner']} {row['backend']}", variant_of(row)


def heatmap_squares(latest: Sequence[Mapping[str, Any]]):
    """(rows, columns, {(row, column): history row}) of one model's heatmap: rows are
    "runner backend", columns variant_of; canaries are left out. Runner, backend and variant
    are the whole cell id but the model, so a square never holds two cells."""
    cells = [r for r in latest if not is_canary(str(r["cell_id"]))]
    squares = {_square(r): r for r in cells}
    rows = sorted({row for row, _ in squares})
    cols = sorted({col for _, col in squares}, key=variant_sort_key)
    return rows, cols, squares


def plot_heatmap(model: str, latest: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Heatmap of `latest` rows of one model (see module docstring) saved to `path`."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    rows, cols, squares = heatmap_squares(latest)
    palette = [MISSING_COLOUR] + [OUTCOME_COLOURS[o] for o in OUTCOME_ORDER]
    codes = [[0] * len(cols) for _ in rows]
    labels = [[""] * len(cols) for _ in rows]
    for (row, col), r in squares.items():
        i, j = rows.index(row), cols.index(col)
        outcome = _outcome(r)
        codes[i][j] = 1 + (OUTCOME_ORDER.index(outcome) if outcome in OUTCOME_ORDER else 1)
        labels[i][j] = (f"{float(r['delta']):+.2f}" if r.get("delta") is not None
                        else outcome[:4])
    fig = _figure(max(4.0, 1.0 + 0.9 * len(cols)), max(2.0, 1.2 + 0.45 * len(rows)))
    ax = fig.add_subplot()
    ax.imshow(codes, cmap=ListedColormap(palette), vmin=-0.5, vmax=len(palette) - 0.5,
              aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            if labels[i][j]:
                ax.text(j, i, labels[i][j], ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(cols)), cols, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_title(f"{model}\nnewest verdict, label = accuracy delta", fontsize=9)
    present = [o for o in OUTCOME_ORDER if any(_outcome(r) == o for r in squares.values())]
    ax.legend(handles=[Patch(color=OUTCOME_COLOURS[o], label=o) for o in present],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def _release_key(version: str):
    from packaging.version import InvalidVersion, Version

    try:
        return (0, Version(version.split("+")[0]), version)
    except InvalidVersion:
        return (1, None, version)


def release_squares(rows: Sequence[Mapping[str, Any]]):
    """(releases oldest first, cell ids, {(cell id, release): its newest row on that release})
    of the vLLM release x cell heatmap; canaries keep their own rows (their outcome is whether
    the harness saw the fault on that release)."""
    squares: dict[tuple[str, str], Mapping[str, Any]] = {}
    for row in rows:        # oldest first: a later run of a cell on a release replaces it
        if row.get("vllm_version"):
            squares[(str(row["cell_id"]), str(row["vllm_version"]))] = row
    releases = sorted({release for _, release in squares}, key=_release_key)
    cells = sorted({cell for cell, _ in squares}, key=lambda c: (is_canary(c), c))
    return releases, cells, squares


def plot_release_heatmap(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """The release x cell heatmap (release_squares) saved to `path`: each square the cell's
    newest outcome on that vLLM release, blank where it did not run there."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    releases, cells, squares = release_squares(rows)
    order = [*OUTCOME_ORDER, NOT_APPLICABLE]
    palette = [MISSING_COLOUR] + [OUTCOME_COLOURS[o] for o in OUTCOME_ORDER] + [NOT_APPLICABLE_COLOUR]
    codes = [[0] * len(releases) for _ in cells]
    fig = _figure(max(4.0, 3.5 + 0.9 * len(releases)), max(2.0, 1.2 + 0.32 * len(cells)))
    ax = fig.add_subplot()
    for (cell, release), row in squares.items():
        i, j = cells.index(cell), releases.index(release)
        outcome = _outcome(row)
        codes[i][j] = 1 + (order.index(outcome) if outcome in order else 1)
        ax.text(j, i, outcome[:6], ha="center", va="center", fontsize=7)
    ax.imshow(codes, cmap=ListedColormap(palette), vmin=-0.5, vmax=len(palette) - 0.5,
              aspect="auto")
    ax.set_xticks(range(len(releases)), [f"vLLM {r}" for r in releases], rotation=45,
                  ha="right", fontsize=8)
    ax.set_yticks(range(len(cells)), cells, fontsize=7)
    ax.set_title("newest verdict per vLLM release", fontsize=9)
    present = sorted({_outcome(r) for r in squares.values()}, key=lambda o: (
        order.index(o) if o in order else len(order)))
    colours = {**OUTCOME_COLOURS, NOT_APPLICABLE: NOT_APPLICABLE_COLOUR}
    ax.legend(handles=[Patch(color=colours.get(o, MISSING_COLOUR),
                             label="not applicable" if o == NOT_APPLICABLE else o)
                       for o in present],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def plot_trend(cell_id: str, entries: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Delta (with CI) and both accuracies of one cell per run, saved to `path`."""
    xs = list(range(len(entries)))
    ticks = [str(e.get("created_at") or e.get("run_created_at") or e["run_id"])[:10]
             for e in entries]
    fig = _figure(5.0, 3.6)
    ax_delta, ax_acc = fig.subplots(2, 1, sharex=True)
    for x, e in zip(xs, entries):
        colour = OUTCOME_COLOURS.get(_outcome(e), MISSING_COLOUR)
        if e.get("delta") is None:
            ax_delta.scatter([x], [0.0], marker="x", color=colour)
            continue
        delta = float(e["delta"])
        err = None
        if e.get("ci_lo") is not None and e.get("ci_hi") is not None:
            err = [[max(0.0, delta - float(e["ci_lo"]))], [max(0.0, float(e["ci_hi"]) - delta)]]
        ax_delta.errorbar([x], [delta], yerr=err, fmt="o", color=colour, capsize=3)
    ax_delta.axhline(0.0, color="#888888", linewidth=0.8)
    ax_delta.set_ylabel("P/D - baseline", fontsize=8)
    for key, label in (("baseline_acc", "baseline"), ("pd_acc", "P/D")):
        points = [(x, float(e[key])) for x, e in zip(xs, entries) if e.get(key) is not None]
        if points:
            ax_acc.plot(*zip(*points), marker=".", label=label)
    ax_acc.set_ylabel("accuracy", fontsize=8)
    ax_acc.legend(fontsize=7, frameon=False)
    ax_acc.set_xticks(xs, ticks, rotation=45, ha="right", fontsize=7)
    ax_delta.set_title(cell_id, fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def soak_of(row: Mapping[str, Any]) -> dict | None:
    """The soak series of a cell's record (metrics.weather.soak), or None (not a soak)."""
    try:
        record = json.loads(Path(row["record_path"]).read_text())
    except (OSError, TypeError, ValueError, KeyError):
        return None
    soak = ((record.get("metrics") or {}).get("weather") or {}).get("soak")
    return soak if isinstance(soak, dict) and soak.get("windows") else None


def plot_soak(cell_id: str, soak: Mapping[str, Any], path: Path) -> Path:
    """A soak's windows over the request index: agreement with the baseline (line, left axis)
    and requests whose KV differs or that failed (bars, right axis). SVG: text stays text."""
    windows = soak["windows"]
    starts = [int(w["first"]) for w in windows]
    width = max(1, int(soak.get("window") or 100))
    fig = _figure(6.4, 3.4)
    ax = fig.subplots()
    points = [(x, float(w["agreement"])) for x, w in zip(starts, windows)
              if w.get("agreement") is not None]
    if points:
        ax.plot(*zip(*points), marker=".", color="#1e88e5", label="agreement with the baseline")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("agreement", fontsize=8)
    ax.set_xlabel("request index (soak)", fontsize=8)
    bars = ax.twinx()
    bars.bar(starts, [int(w["differs"]) for w in windows], width=width * 0.8, align="edge",
             color="#e53935", alpha=0.5, label="KV differs")
    bars.bar(starts, [int(w["failed"]) for w in windows], width=width * 0.8, align="edge",
             bottom=[int(w["differs"]) for w in windows], color="#8e24aa", alpha=0.5,
             label="failed")
    bars.set_ylim(0, width)
    bars.set_ylabel(f"requests of {width}", fontsize=8)
    handles = ax.get_legend_handles_labels()[0] + bars.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=7, frameon=False, loc="lower left")
    ax.set_title("\n".join([cell_id] + textwrap.wrap(str(soak.get("line", "")), 110)[:3]),
                 fontsize=6.5)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg")
    return path


# ---- the report -------------------------------------------------------------------------------
def _soak_plots(rows: Sequence[Mapping[str, Any]], out: Path, img: Path) -> list[dict[str, Any]]:
    """One soak plot per row that ran the soak weather: agreement and mismatches per window."""
    soaks = []
    for row in rows:
        soak = soak_of(row)
        if soak is not None:
            path = plot_soak(str(row["cell_id"]), soak, img / f"soak-{_slug(str(row['cell_id']))}.svg")
            soaks.append({"cell_id": row["cell_id"], "src": path.relative_to(out).as_posix(),
                          "line": soak.get("line", ""), "outcome": _outcome(row)})
    return soaks


def render_report(history_db: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                  title: str = "P/D accuracy report",
                  max_trend_plots: int = DEFAULT_MAX_TREND_PLOTS) -> Path:
    """Write the HTML report of `history_db` into `out_dir`; returns the index.html path."""
    out = Path(out_dir)
    img = out / "img"
    img.mkdir(parents=True, exist_ok=True)
    every_row = [with_canary_outcome(r) for r in load_cells(history_db)]
    # a cell its release cannot run has no verdict: only the release x cell heatmap shows it
    rows = [r for r in every_row if _outcome(r) != NOT_APPLICABLE]
    runs = load_runs(history_db)
    by_cell = history_by_cell(rows)
    newest = sorted((entries[-1] for entries in by_cell.values()),
                    key=lambda r: (outcome_rank(_outcome(r)), str(r["cell_id"])))
    latest = [r for r in newest if not is_canary(str(r["cell_id"]))]
    canaries = [{**r, "fault": fault_label(str(r["cell_id"]))} for r in newest
                if is_canary(str(r["cell_id"]))]
    changes = changes_since_previous(rows)

    heatmaps = []
    models = sorted({str(r.get("model_short") or r.get("model")) for r in latest})
    for model in models:
        members = [r for r in latest if str(r.get("model_short") or r.get("model")) == model]
        path = plot_heatmap(model, members, img / f"heatmap-{_slug(model)}.png")
        heatmaps.append({"model": model, "src": path.relative_to(out).as_posix(),
                         "cells": len(members)})

    release_map = None
    if len({r.get("vllm_version") for r in every_row if r.get("vllm_version")}) >= 2:
        path = plot_release_heatmap(every_row, img / "heatmap-vllm-releases.png")
        release_map = {"src": path.relative_to(out).as_posix(),
                       "releases": release_squares(every_row)[0]}

    changed = {c.cell_id for c in changes}
    trend_ids = [cid for cid, entries in by_cell.items()
                 if len(entries) >= 2 and not is_canary(cid)]
    trend_ids.sort(key=lambda cid: (cid not in changed, cid))
    trends = []
    for cell_id in trend_ids[:max_trend_plots]:
        path = plot_trend(cell_id, by_cell[cell_id], img / f"trend-{_slug(cell_id)}.png")
        trends.append({"cell_id": cell_id, "src": path.relative_to(out).as_posix(),
                       "changed": cell_id in changed})

    soaks = _soak_plots(newest, out, img)   # canaries too: a late fault shows where it began

    def record_link(row: Mapping[str, Any]) -> str | None:
        path = row.get("record_path")
        if not path:
            return None
        return os.path.relpath(path, out.resolve()) if os.path.isabs(path) else path

    def ran(row: Mapping[str, Any]) -> str:   # what its servers really ran, from its record
        try:
            return effective_summary(json.loads(Path(row["record_path"]).read_text()).get("effective_config"))
        except (OSError, TypeError, ValueError, KeyError, AttributeError):
            return "-"

    counts = [(o, sum(1 for r in latest if _outcome(r) == o)) for o in OUTCOME_ORDER]
    html = jinja_env().get_template("report.html.j2").render(
        title=title,
        runs=runs,
        latest=latest,
        counts=[(o, n) for o, n in counts if n],
        canaries=canaries,
        canary_count=canary_summary([_outcome(r) for r in canaries]),
        regressions=[c for c in changes if c.is_regression],
        recoveries=[c for c in changes if not c.is_regression],
        heatmaps=heatmaps,
        release_map=release_map,
        trends=trends,
        soaks=soaks,
        trends_left_out=max(0, len(trend_ids) - max_trend_plots),
        colours=OUTCOME_COLOURS,
        outcome_of=_outcome,
        record_link=record_link,
        ran=ran,
    )
    index = out / "index.html"
    from harness.core.atomic import atomic_write_text

    atomic_write_text(index, html)
    return index


__all__ = ["Change", "changes_since_previous", "compare", "delta_drifted", "heatmap_squares",
           "history_by_cell", "plot_heatmap", "plot_release_heatmap", "plot_soak", "plot_trend",
           "release_squares", "render_report", "soak_of"]
