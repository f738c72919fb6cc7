"""History store: every run's records, appended to one SQLite file (default results/history.sqlite).

Schema (``PRAGMA user_version`` = 2; a version-1 store, whose ``kv_bytes`` column had its only
connector's name, is migrated in place on open: harness.core.old_records)::

    runs(
      run_id       TEXT PRIMARY KEY,   -- record["run_id"]: one harness invocation
      created_at   TEXT,               -- earliest record["created_at"] of the run (ISO 8601, UTC)
      git_sha      TEXT,               -- record["versions"]["harness"]
      vllm_version TEXT,               -- record["versions"]["vllm"]
      profile      TEXT,               -- record["profile"] / options["profile"] / options["extra"]["profile"]
      host         TEXT                -- record["hardware"]["hostname"]
    )
    cells(
      run_id TEXT REFERENCES runs(run_id), cell_id TEXT,      -- PRIMARY KEY (run_id, cell_id)
      model TEXT, runner TEXT, backend TEXT,                  -- cell["model"] etc.
      p_block INTEGER, d_block INTEGER,                       -- prefill / decode block size
      tp TEXT,                                                -- "<prefill_tp>x<decode_tp>"
      status TEXT, outcome TEXT,                              -- verdict status / outcome
      baseline_acc REAL, pd_acc REAL, delta REAL,             -- metrics accuracies, pd - baseline
      ci_lo REAL, ci_hi REAL,                                 -- metrics["delta_ci"]
      p_value REAL, mde REAL, n INTEGER, agreement REAL,      -- mcnemar_p, mde, n, agreement
      external_tokens INTEGER, kv_bytes INTEGER,              -- transfer prompt_tokens_external, kv_bytes
      failed_transfers INTEGER,                               -- transfer failed_transfers
      startup_s REAL, total_s REAL,                           -- timings
      record_path TEXT,                                       -- where the record JSON was read
      -- beyond the issue's list, kept because reports need them:
      model_short TEXT, device TEXT, expected_failure TEXT, reason TEXT, created_at TEXT
    )

Appending is idempotent: a (run_id, cell_id) seen again replaces its row (a retried job that
rewrote its record updates the row; appending the same results twice changes nothing).
"""
from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any, Iterable, Mapping

from harness.core.old_records import history_migration

DEFAULT_HISTORY_PATH = "results/history.sqlite"
SCHEMA_VERSION = 2
# version -> the statements that bring a store of that version to the next one
MIGRATIONS = {1: history_migration()}

CELL_COLUMNS = (
    "run_id", "cell_id", "model", "runner", "backend", "p_block", "d_block", "tp", "status",
    "outcome", "baseline_acc", "pd_acc", "delta", "ci_lo", "ci_hi", "p_value", "mde", "n",
    "agreement", "external_tokens", "kv_bytes", "failed_transfers", "startup_s", "total_s",
    "record_path", "model_short", "device", "expected_failure", "reason", "created_at",
)
RUN_COLUMNS = ("run_id", "created_at", "git_sha", "vllm_version", "profile", "host")

_DDL = """
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY,
  created_at TEXT,
  git_sha TEXT,
  vllm_version TEXT,
  profile TEXT,
  host TEXT
);
CREATE TABLE IF NOT EXISTS cells (
  run_id TEXT NOT NULL REFERENCES runs(run_id),
  cell_id TEXT NOT NULL,
  model TEXT, runner TEXT, backend TEXT,
  p_block INTEGER, d_block INTEGER, tp TEXT,
  status TEXT, outcome TEXT,
  baseline_acc REAL, pd_acc REAL, delta REAL, ci_lo REAL, ci_hi REAL,
  p_value REAL, mde REAL, n INTEGER, agreement REAL,
  external_tokens INTEGER, kv_bytes INTEGER, failed_transfers INTEGER,
  startup_s REAL, total_s REAL,
  record_path TEXT,
  model_short TEXT, device TEXT, expected_failure TEXT, reason TEXT, created_at TEXT,
  PRIMARY KEY (run_id, cell_id)
);
CREATE INDEX IF NOT EXISTS cells_by_cell ON cells(cell_id, created_at);
"""


def connect(db_path: str | os.PathLike[str] = DEFAULT_HISTORY_PATH) -> sqlite3.Connection:
    """Open (creating if needed) the history database; rows come back as sqlite3.Row."""
    path = Path(db_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=60)   # parallel jobs may append at once
    conn.row_factory = sqlite3.Row
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version not in (0, SCHEMA_VERSION, *MIGRATIONS):
        conn.close()
        raise RuntimeError(f"{path}: history schema version {version}, expected {SCHEMA_VERSION}")
    with conn:   # one transaction: a store is migrated whole or not at all
        while version in MIGRATIONS:
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
            version += 1
            conn.execute(f"PRAGMA user_version = {version}")
    conn.executescript(_DDL)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return conn


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def _profile(record: Mapping[str, Any]) -> str | None:
    return (record.get("profile") or _get(record, "options", "profile")
            or _get(record, "options", "extra", "profile"))


def cell_row(record: Mapping[str, Any]) -> dict[str, Any]:
    """The `cells` row of one result record (see the module docstring for the mapping)."""
    cell = record.get("cell") or {}
    metrics = record.get("metrics") or {}
    verdict = record.get("verdict") or {}
    transfer = metrics.get("transfer") or {}
    timings = record.get("timings") or {}
    ci = metrics.get("delta_ci") or [None, None]
    model = cell.get("model")
    model_short = cell.get("model_tag") or (str(model).rstrip("/").split("/")[-1] if model else None)
    tp = (f"{cell.get('prefill_tp')}x{cell.get('decode_tp')}"
          if cell.get("prefill_tp") is not None else None)
    return {
        "run_id": record["run_id"],
        "cell_id": cell.get("id"),
        "model": model,
        "runner": cell.get("runner"),
        "backend": cell.get("backend"),
        "p_block": cell.get("prefill_block_size"),
        "d_block": cell.get("decode_block_size"),
        "tp": tp,
        "status": verdict.get("status"),
        "outcome": verdict.get("outcome") or verdict.get("status"),
        "baseline_acc": metrics.get("baseline_accuracy"),
        "pd_acc": metrics.get("pd_accuracy"),
        "delta": metrics.get("accuracy_delta"),
        "ci_lo": ci[0] if len(ci) > 0 else None,
        "ci_hi": ci[1] if len(ci) > 1 else None,
        "p_value": metrics.get("mcnemar_p"),
        "mde": metrics.get("mde"),
        "n": metrics.get("n"),
        "agreement": metrics.get("agreement"),
        "external_tokens": transfer.get("prompt_tokens_external"),
        "kv_bytes": transfer.get("kv_bytes"),
        "failed_transfers": transfer.get("failed_transfers"),
        "startup_s": timings.get("startup_s"),
        "total_s": timings.get("total_s"),
        "record_path": str(Path(record["_path"]).resolve()) if record.get("_path") else None,
        "model_short": model_short,
        "device": cell.get("device"),
        "expected_failure": verdict.get("expected_failure") or cell.get("expected_failure"),
        "reason": verdict.get("reason"),
        "created_at": record.get("created_at"),
    }


def run_row(record: Mapping[str, Any]) -> dict[str, Any]:
    """The `runs` row one record contributes to."""
    return {
        "run_id": record["run_id"],
        "created_at": record.get("created_at"),
        "git_sha": _get(record, "versions", "harness"),
        "vllm_version": _get(record, "versions", "vllm"),
        "profile": _profile(record),
        "host": _get(record, "hardware", "hostname"),
    }


def append_records(db_path: str | os.PathLike[str], records: Iterable[Mapping[str, Any]]) -> int:
    """Add `records` to the store (idempotent on (run_id, cell_id)); returns how many were
    written. Records without a run id or cell id are skipped."""
    run_sql = (
        f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) VALUES ({', '.join('?' * len(RUN_COLUMNS))}) "
        "ON CONFLICT(run_id) DO UPDATE SET "
        "created_at = CASE WHEN runs.created_at IS NULL OR excluded.created_at < runs.created_at "
        "             THEN excluded.created_at ELSE runs.created_at END, "
        + ", ".join(f"{c} = COALESCE(excluded.{c}, runs.{c})" for c in RUN_COLUMNS[2:]))
    cell_sql = (
        f"INSERT INTO cells ({', '.join(CELL_COLUMNS)}) "
        f"VALUES ({', '.join('?' * len(CELL_COLUMNS))}) "
        "ON CONFLICT(run_id, cell_id) DO UPDATE SET "
        + ", ".join(f"{c} = excluded.{c}" for c in CELL_COLUMNS[2:]))
    written = 0
    with closing(connect(db_path)) as conn, conn:
        for record in records:
            if not record.get("run_id") or not _get(record, "cell", "id"):
                continue
            run = run_row(record)
            conn.execute(run_sql, [run[c] for c in RUN_COLUMNS])
            row = cell_row(record)
            conn.execute(cell_sql, [row[c] for c in CELL_COLUMNS])
            written += 1
    return written


def append_results_dir(db_path: str | os.PathLike[str],
                       results_dir: str | os.PathLike[str]) -> int:
    """Append every record found (recursively) below `results_dir`; returns how many."""
    from harness.run.record import load_not_applicable, load_records

    return append_records(db_path, [*load_records(results_dir), *load_not_applicable(results_dir)])


def _query(db_path: str | os.PathLike[str], sql: str, params: tuple = ()) -> list[dict[str, Any]]:
    """Rows of `sql` on the store, read only: nothing is created, migrated or written (a render
    is no write). A store of an older schema is migrated in a temporary copy; none: no rows."""
    path = Path(db_path)
    if not path.is_file():
        return []
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=60)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version != SCHEMA_VERSION:
        conn.close()
        import shutil
        import tempfile

        with tempfile.TemporaryDirectory(prefix="pd-accuracy-history-") as tmp:
            copy = Path(tmp) / path.name
            shutil.copyfile(path, copy)
            with closing(connect(copy)) as migrated:
                return [dict(r) for r in migrated.execute(sql, params).fetchall()]
    conn.row_factory = sqlite3.Row
    with closing(conn):
        return [dict(r) for r in conn.execute(sql, params).fetchall()]


def load_runs(db_path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All runs, oldest first (read only)."""
    return _query(db_path, "SELECT * FROM runs ORDER BY created_at, run_id")


def load_cells(db_path: str | os.PathLike[str], cell_id: str | None = None) -> list[dict[str, Any]]:
    """Cell rows joined with their run (``run_created_at``, ``git_sha``, ``vllm_version``,
    ``profile``, ``host``), oldest first; only `cell_id`'s when given (read only)."""
    sql = ("SELECT cells.*, runs.created_at AS run_created_at, runs.git_sha, runs.vllm_version, "
           "runs.profile, runs.host FROM cells JOIN runs USING (run_id)")
    params: tuple = ()
    if cell_id is not None:
        sql += " WHERE cells.cell_id = ?"
        params = (cell_id,)
    sql += " ORDER BY COALESCE(cells.created_at, runs.created_at), cells.run_id, cells.cell_id"
    return _query(db_path, sql, params)


__all__ = ["CELL_COLUMNS", "DEFAULT_HISTORY_PATH", "RUN_COLUMNS", "append_records",
           "append_results_dir", "cell_row", "connect", "load_cells", "load_runs", "run_row"]
