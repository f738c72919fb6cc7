"""The static HTML report a person reads: what each cell's verdict is and what it rests on.

``render_report(history_db, out_dir)`` writes ``out_dir/index.html`` (templates/report.html.j2)
and its figures under ``out_dir/img/``, in this order:

* the verdict table first: one line per cell (canaries too, with their fault), worst first,
  sortable by any column and filterable by text, outcome and kind; a click on a line opens its
  details: the whole reason, the transfer proof and KV digest, what the servers ran, every check
  (harness.report.cell_view);
* a forest plot of every cell's accuracy delta in points with the interval its verdict used and
  the non-inferiority margin (`plot_forest`);
* folded below, opened on a click: "changes since the previous run" for each cell, its newest
  entry against the one before it (new FAIL, newly ERROR, new XPASS, newly MISSED, recovered,
  and, when none applies and not for a canary, significant drift of the delta: the two deltas'
  CIs do not overlap, or without CIs they differ by more than the larger MDE); one heatmap per
  model (rows runner x backend, columns the rest of the configuration, one square per cell,
  canaries left out); the vLLM release x cell heatmap, where a cell its release cannot run is
  grey "N/A"; one trend plot per real cell with two entries or more (changed cells first, at most
  `max_trend_plots`); the windows of each weather's request series (the requests a
  weather sends on its own after the first look).

Units are points for deltas and percent for accuracies everywhere (harness.report.evidence);
each outcome has one colour of its own (OUTCOME_COLOURS). Rendering writes only under
`out_dir`; adding records to a history is a separate, asked-for step (`pd-accuracy history`).
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

from harness.core.old_records import with_todays_names
from harness.core.outcomes import summary_line
from harness.report.annotate import OUTCOME_ORDER, fmt_delta, jinja_env
from harness.report.evidence import pts
from harness.report.cell_ids import (canary_summary, fault_label, is_canary, variant_of,
                                     variant_sort_key, with_canary_outcome)
from harness.report.cell_view import cell_view
from harness.report.history import load_cells, load_runs

# one colour per outcome, told apart by hue (an XFAIL is teal, never a pale PASS green); the
# text drawn on each is white, except on INCONCLUSIVE's yellow (TEXT_ON)
OUTCOME_COLOURS = {
    "PASS": "#2e7d32", "XFAIL": "#00838f", "INCONCLUSIVE": "#f9a825", "XPASS": "#ef6c00",
    "FAIL": "#d32f2f", "ERROR": "#6a1b9a", "CAUGHT": "#1565c0", "MISSED": "#880e4f",
}
TEXT_ON = {o: "#ffffff" for o in OUTCOME_COLOURS} | {"INCONCLUSIVE": "#212121"}
MISSING_COLOUR = "#eeeeee"
# a cell its vLLM release cannot run (harness.run.record.NOT_APPLICABLE_OUTCOME): never started
NOT_APPLICABLE = "N/A"
NOT_APPLICABLE_COLOUR = "#9e9e9e"
TEXT_ON[NOT_APPLICABLE] = "#ffffff"
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
        labels[i][j] = (pts(r["delta"]) if r.get("delta") is not None else outcome[:4])
    fig = _figure(max(4.0, 1.0 + 0.9 * len(cols)), max(2.0, 1.2 + 0.45 * len(rows)))
    ax = fig.add_subplot()
    ax.imshow(codes, cmap=ListedColormap(palette), vmin=-0.5, vmax=len(palette) - 0.5,
              aspect="auto")
    for (row, col), r in squares.items():
        i, j = rows.index(row), cols.index(col)
        ax.text(j, i, labels[i][j], ha="center", va="center", fontsize=8,
                color=TEXT_ON.get(_outcome(r), "#212121"))
    ax.set_xticks(range(len(cols)), cols, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_title(f"{model}\nnewest verdict, label = accuracy delta (pts)", fontsize=9)
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
    label_in = 0.055 * max([len(c) for c in cells] or [10])    # 7-point labels: inches
    fig = _figure(max(4.0, 2.5 + label_in + 0.9 * len(releases)), max(2.0, 1.2 + 0.32 * len(cells)))
    ax = fig.add_subplot()
    for (cell, release), row in squares.items():
        i, j = cells.index(cell), releases.index(release)
        outcome = _outcome(row)
        codes[i][j] = 1 + (order.index(outcome) if outcome in order else 1)
        ax.text(j, i, outcome[:6], ha="center", va="center", fontsize=7,
                color=TEXT_ON.get(outcome, "#212121"))
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
        delta = 100 * float(e["delta"])
        err = None
        if e.get("ci_lo") is not None and e.get("ci_hi") is not None:
            err = [[max(0.0, delta - 100 * float(e["ci_lo"]))],
                   [max(0.0, 100 * float(e["ci_hi"]) - delta)]]
        ax_delta.errorbar([x], [delta], yerr=err, fmt="o", color=colour, capsize=3)
    ax_delta.axhline(0.0, color="#888888", linewidth=0.8)
    ax_delta.set_ylabel("P/D - baseline (pts)", fontsize=8)
    for key, label in (("baseline_acc", "baseline"), ("pd_acc", "P/D")):
        points = [(x, 100 * float(e[key])) for x, e in zip(xs, entries) if e.get(key) is not None]
        if points:
            ax_acc.plot(*zip(*points), marker=".", label=label)
    ax_acc.set_ylabel("accuracy (%)", fontsize=8)
    ax_acc.legend(fontsize=7, frameon=False)
    ax_acc.set_xticks(xs, ticks, rotation=45, ha="right", fontsize=7)
    ax_delta.set_title(cell_id, fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def series_of(row: Mapping[str, Any]) -> dict | None:
    """The request series of a cell's record (metrics.weather.series; older records' names
    translated), or None (its weather sent none)."""
    try:
        record = with_todays_names(json.loads(Path(row["record_path"]).read_text()))
    except (OSError, TypeError, ValueError, KeyError, AttributeError):
        return None
    series = ((record.get("metrics") or {}).get("weather") or {}).get("series")
    return series if isinstance(series, dict) and series.get("windows") else None


def plot_series(cell_id: str, series: Mapping[str, Any], path: Path) -> Path:
    """A request series' windows over the request index: agreement with the baseline (line, left axis)
    and requests whose KV differs or that failed (bars, right axis). SVG: text stays text."""
    windows = series["windows"]
    starts = [int(w["first"]) for w in windows]
    width = max(1, int(series.get("window") or 100))
    fig = _figure(6.4, 3.4)
    ax = fig.subplots()
    points = [(x, float(w["agreement"])) for x, w in zip(starts, windows)
              if w.get("agreement") is not None]
    if points:
        ax.plot(*zip(*points), marker=".", color="#1e88e5", label="agreement with the baseline")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("agreement", fontsize=8)
    ax.set_xlabel("request index (series)", fontsize=8)
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
    ax.set_title("\n".join([cell_id] + textwrap.wrap(str(series.get("line", "")), 110)[:3]),
                 fontsize=6.5)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg")
    return path


def plot_forest(cells: Sequence[Mapping[str, Any]], path: Path) -> Path | None:
    """Every cell's accuracy delta (points) with its interval, one row each in the table's
    order, against 0 and the non-inferiority margin: a PASS needs the interval's lower end right
    of the margin. A solid line is the interval the verdict used; a dashed one a 95 % descriptive
    interval (the verdict rested on other checks). SVG: its text stays text. None: no cell has a
    delta."""
    from matplotlib.lines import Line2D

    shown = [c for c in cells if c["accuracy"].delta is not None]
    if not shown:
        return None
    fig = _figure(13.4, 1.3 + 0.24 * len(shown))
    ax = fig.add_subplot()
    for y, cell in enumerate(shown):
        acc, colour = cell["accuracy"], OUTCOME_COLOURS.get(cell["outcome"], "#616161")
        if acc.lo is not None and acc.hi is not None:
            ax.plot([100 * acc.lo, 100 * acc.hi], [y, y], color=colour, linewidth=2,
                    linestyle="-" if cell["verdict_interval"] else (0, (2, 1.5)))
        ax.plot([100 * acc.delta], [y], marker="o", markersize=5, color=colour,
                markerfacecolor=colour if cell["verdict_interval"] else "white")
    margins = sorted({c["accuracy"].margin for c in shown if c["accuracy"].margin is not None})
    for margin in margins or [0.05]:
        ax.axvline(-100 * margin, color="#d32f2f", linestyle="--", linewidth=1)
    ax.axvline(0.0, color="#757575", linewidth=0.8)
    ax.set_yticks(range(len(shown)), [c["id"] for c in shown], fontsize=6.5, family="monospace")
    ax.invert_yaxis()
    ax.set_xlabel("P/D accuracy - baseline accuracy (points)", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    present = [o for o in OUTCOME_ORDER if any(c["outcome"] == o for c in shown)]
    handles = [Line2D([], [], color=OUTCOME_COLOURS[o], marker="o", label=o) for o in present]
    handles += [Line2D([], [], color="#424242", label="interval the verdict used"),
                Line2D([], [], color="#424242", linestyle=(0, (2, 1.5)), marker="o",
                       markerfacecolor="white", label="95 % descriptive interval"),
                Line2D([], [], color="#d32f2f", linestyle="--",
                       label="margin: " + ", ".join(f"-{100 * m:.1f} pts" for m in margins or [0.05]))]
    ax.legend(handles=handles, fontsize=7, frameon=False, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg")
    return path


# ---- the report -------------------------------------------------------------------------------
def _series_plots(rows: Sequence[Mapping[str, Any]], out: Path, img: Path) -> list[dict[str, Any]]:
    """One plot per row whose weather sent a request series: agreement and mismatches per
    window."""
    plots = []
    for row in rows:
        series = series_of(row)
        if series is not None:
            name = f"series-{_slug(str(row['cell_id']))}.svg"
            path = plot_series(str(row["cell_id"]), series, img / name)
            plots.append({"cell_id": row["cell_id"], "src": path.relative_to(out).as_posix(),
                          "line": series.get("line", ""), "outcome": _outcome(row)})
    return plots


def _heatmaps(latest: Sequence[Mapping[str, Any]], every_row: Sequence[Mapping[str, Any]],
              out: Path, img: Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """One heatmap per model of the real cells, and the release x cell heatmap (two releases
    or more)."""
    heatmaps = []
    for model in sorted({str(r.get("model_short") or r.get("model")) for r in latest}):
        members = [r for r in latest if str(r.get("model_short") or r.get("model")) == model]
        path = plot_heatmap(model, members, img / f"heatmap-{_slug(model)}.png")
        heatmaps.append({"model": model, "src": path.relative_to(out).as_posix(),
                         "cells": len(members)})
    release_map = None
    if len({r.get("vllm_version") for r in every_row if r.get("vllm_version")}) >= 2:
        path = plot_release_heatmap(every_row, img / "heatmap-vllm-releases.png")
        release_map = {"src": path.relative_to(out).as_posix(),
                       "releases": release_squares(every_row)[0]}
    return heatmaps, release_map


def _trends(by_cell: Mapping[str, list], changed: set[str], out: Path, img: Path,
            max_plots: int) -> tuple[list[dict[str, Any]], int]:
    """Trend plots of the real cells with a history, changed ones first; and how many were
    left out past `max_plots`."""
    ids = sorted((cid for cid, entries in by_cell.items() if len(entries) >= 2 and not is_canary(cid)),
                 key=lambda cid: (cid not in changed, cid))
    trends = []
    for cell_id in ids[:max_plots]:
        path = plot_trend(cell_id, by_cell[cell_id], img / f"trend-{_slug(cell_id)}.png")
        trends.append({"cell_id": cell_id, "src": path.relative_to(out).as_posix(),
                       "changed": cell_id in changed})
    return trends, max(0, len(ids) - max_plots)


def _chips(outcomes: Sequence[str]) -> list[tuple[str, int, str]]:
    """(outcome, count, words) in the order and words of the run's summary line."""
    from harness.core.outcomes import CAUGHT, MISSED, SUMMARY_ORDER

    chips = []
    for o in [*SUMMARY_ORDER, *sorted(set(outcomes) - set(SUMMARY_ORDER))]:
        n = outcomes.count(o)
        if n:
            noun = "canary" if n == 1 else "canaries"
            chips.append((o, n, f"{n} {noun} {o.lower()}" if o in (CAUGHT, MISSED) else f"{n} {o}"))
    return chips


def render_report(history_db: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                  title: str = "P/D accuracy report",
                  max_trend_plots: int = DEFAULT_MAX_TREND_PLOTS) -> Path:
    """Write the HTML report of `history_db` into `out_dir`; returns the index.html path. Reads
    the history (never writes it) and each newest row's record."""
    out = Path(out_dir)
    img = out / "img"
    img.mkdir(parents=True, exist_ok=True)
    every_row = [with_canary_outcome(r) for r in load_cells(history_db)]
    # a cell its release cannot run has no verdict: only the release x cell heatmap shows it
    rows = [r for r in every_row if _outcome(r) != NOT_APPLICABLE]
    by_cell = history_by_cell(rows)
    cells = sorted((cell_view(entries[-1], out) for entries in by_cell.values()),
                   key=lambda c: (c["rank"], c["kind"] == "canary", c["id"]))
    latest = [entries[-1] for cid, entries in by_cell.items() if not is_canary(cid)]
    changes = changes_since_previous(rows)
    heatmaps, release_map = _heatmaps(latest, every_row, out, img)
    trends, left_out = _trends(by_cell, {c.cell_id for c in changes}, out, img, max_trend_plots)
    forest = plot_forest(cells, img / "forest.svg")
    outcomes = [c["outcome"] for c in cells]
    html = jinja_env().get_template("report.html.j2").render(
        title=title, runs=load_runs(history_db), cells=cells, summary=summary_line(outcomes),
        counts=[(o, outcomes.count(o)) for o in OUTCOME_ORDER if o in outcomes],
        chips=_chips(outcomes),
        forest=forest.relative_to(out).as_posix() if forest else None,
        forest_left_out=sum(1 for c in cells if c["accuracy"].delta is None),
        regressions=[c for c in changes if c.is_regression],
        recoveries=[c for c in changes if not c.is_regression],
        heatmaps=heatmaps, release_map=release_map, trends=trends, trends_left_out=left_out,
        series=_series_plots([entries[-1] for entries in by_cell.values()], out, img),
        colours=OUTCOME_COLOURS, text_on=TEXT_ON, outcome_of=_outcome,
        not_applicable_colour=NOT_APPLICABLE_COLOUR,
    )
    index = out / "index.html"
    from harness.core.atomic import atomic_write_text

    atomic_write_text(index, html)
    return index


__all__ = ["Change", "NOT_APPLICABLE", "OUTCOME_COLOURS", "TEXT_ON", "changes_since_previous",
           "compare", "delta_drifted", "heatmap_squares", "history_by_cell", "plot_forest",
           "plot_heatmap", "plot_release_heatmap", "plot_series", "plot_trend", "release_squares",
           "render_report", "series_of"]
