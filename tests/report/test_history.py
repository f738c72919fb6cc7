"""History store: schema, idempotent appends, field mapping."""
from __future__ import annotations

import copy
import sqlite3
from pathlib import Path

from harness.cli.main import main
from harness.report.history import (_DDL, CELL_COLUMNS, RUN_COLUMNS, append_records, append_results_dir,
                             connect, load_cells, load_runs)
from harness.run.record import load_records

RECORDS = Path(__file__).resolve().parents[1] / "data" / "records"
RUN_1, RUN_2 = "20261101T020000Z-aaaaaa", "20261102T020000Z-bbbbbb"


def test_schema_has_the_documented_tables_and_columns(tmp_path):
    db = tmp_path / "h.sqlite"
    connect(db).close()
    conn = sqlite3.connect(db)
    runs = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    cells = [r[1] for r in conn.execute("PRAGMA table_info(cells)")]
    pk = [r[1] for r in sorted(conn.execute("PRAGMA table_info(cells)"), key=lambda r: r[5]) if r[5]]
    assert runs == list(RUN_COLUMNS)
    assert cells == list(CELL_COLUMNS)
    assert pk == ["run_id", "cell_id"]
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 2


def test_append_is_idempotent(tmp_path):
    db = tmp_path / "results" / "history.sqlite"
    assert append_results_dir(db, RECORDS) == 11
    assert append_results_dir(db, RECORDS) == 11      # written again, replacing the same rows
    assert len(load_cells(db)) == 11
    assert [r["run_id"] for r in load_runs(db)] == [RUN_1, RUN_2]


def test_rows_map_record_fields(tmp_path):
    db = tmp_path / "h.sqlite"
    append_results_dir(db, RECORDS)
    runs = {r["run_id"]: r for r in load_runs(db)}
    assert runs[RUN_2] == {"run_id": RUN_2, "created_at": "2026-11-02T02:10:00Z",
                           "git_sha": "2222222", "vllm_version": "0.32.1", "profile": "nightly",
                           "host": runs[RUN_2]["host"]}
    assert runs[RUN_2]["host"] in {"ci-cpu-1", "gpu-h200-3"}
    (row,) = load_cells(db, "v1-CPU_ATTN-p16d128-tiny-llama-gsm-tp1x1")[1:]
    assert row["run_id"] == RUN_2
    assert (row["model"], row["runner"], row["backend"], row["p_block"], row["d_block"],
            row["tp"]) == ("tiny-llama-gsm", "v1", "CPU_ATTN", 16, 128, "1x1")
    assert (row["status"], row["outcome"]) == ("FAIL", "FAIL")
    assert (row["baseline_acc"], row["pd_acc"]) == (0.9, 0.7)
    assert abs(row["delta"] + 0.2) < 1e-9
    assert (row["ci_lo"], row["ci_hi"], row["p_value"], row["mde"], row["n"]) == \
        (-0.3, -0.1, 2e-4, 0.12, 50)
    assert (row["external_tokens"], row["kv_bytes"], row["failed_transfers"]) == (15000, 7340032, 0)
    assert (row["startup_s"], row["total_s"]) == (31.2, 80.0)
    assert Path(row["record_path"]).is_file()
    xfail = load_cells(db, "v2-FLASH_ATTN-p16d16-Qwen3-0.6B-tp1x1")[-1]
    assert (xfail["status"], xfail["outcome"]) == ("FAIL", "XFAIL")
    assert xfail["expected_failure"].startswith("upstream")
    error = load_cells(db, "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1")[-1]
    assert error["outcome"] == "ERROR" and error["delta"] is None and error["ci_lo"] is None


def test_rewritten_record_replaces_its_row(tmp_path):
    db = tmp_path / "h.sqlite"
    records = load_records(RECORDS / RUN_2)
    append_records(db, records)
    retried = copy.deepcopy(next(r for r in records if r["verdict"]["status"] == "ERROR"))
    retried["verdict"].update(status="PASS", outcome="PASS")
    assert append_records(db, [retried]) == 1
    rows = load_cells(db, retried["cell"]["id"])
    assert [r["outcome"] for r in rows] == ["PASS"]


def test_records_without_ids_are_skipped(tmp_path):
    record = copy.deepcopy(load_records(RECORDS / RUN_1)[0])
    record["run_id"] = None
    assert append_records(tmp_path / "h.sqlite", [record]) == 0


def test_cli_history_append(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    assert main(["history", "--results-dir", str(RECORDS), "--history", str(db)]) == 0
    assert "11 records appended" in capsys.readouterr().out
    assert main(["history", "--results-dir", str(tmp_path / "missing"), "--history", str(db)]) == 2


def test_a_version_1_store_is_read_as_is_and_migrated_in_place_on_append(tmp_path):
    """A store written before the connector seam has a nixl_bytes column: a read sees it as
    kv_bytes and leaves the file alone (a render writes nothing); an append migrates it in
    place, its rows kept."""
    db = tmp_path / "old.sqlite"
    conn = sqlite3.connect(db)
    ddl = _DDL.replace("kv_bytes INTEGER", "nixl_bytes INTEGER")
    conn.executescript(ddl)
    conn.execute("INSERT INTO runs (run_id) VALUES ('r1')")
    conn.execute("INSERT INTO cells (run_id, cell_id, nixl_bytes) VALUES ('r1', 'c1', 123)")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    [row] = load_cells(db)
    assert row["kv_bytes"] == 123 and "nixl_bytes" not in row
    assert db.read_bytes() == before
    connect(db).close()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
    assert conn.execute("SELECT kv_bytes FROM cells").fetchone()[0] == 123


def test_reading_a_missing_store_creates_nothing(tmp_path):
    assert load_cells(tmp_path / "none" / "h.sqlite") == [] and not (tmp_path / "none").exists()
