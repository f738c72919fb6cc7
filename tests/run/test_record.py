"""Record files: atomic writes, schema validation, path layout, loading."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from harness.core.atomic import atomic_write_json, atomic_write_text
from harness.run import record as record_mod
from harness.run.record import RECORD_KEYS, SCHEMA_VERSION, load_records, validate_record, write_record


def make_record(cell_id: str = "v1-CPU_ATTN-p128d128-tiny-tp1x1", run_id: str = "20261101T000000Z-aaaaaa",
                created_at: str = "2026-11-01T00:00:00Z", status: str = "PASS") -> dict:
    rec = {k: {} for k in RECORD_KEYS}
    rec.update(schema_version=SCHEMA_VERSION, run_id=run_id, created_at=created_at,
               cell={"id": cell_id, "model": "tiny"},
               verdict={"status": status, "outcome": status, "reason": "r", "checks": []})
    return rec


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


# ---- atomic writes --------------------------------------------------------------------------
def test_atomic_write_creates_parents_and_writes(tmp_path):
    target = tmp_path / "a" / "b" / "x.json"
    assert atomic_write_json(target, {"k": [1, 2]}) == target
    assert json.loads(target.read_text()) == {"k": [1, 2]}
    assert leftovers(target.parent) == []


def test_failed_replace_keeps_old_content_and_leaves_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "x.json"
    target.write_text("old\n")

    def broken_replace(src, dst):
        raise OSError("disk on fire")

    monkeypatch.setattr(record_mod.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk on fire"):
        atomic_write_text(target, "new content that must never be seen half-written")
    assert target.read_text() == "old\n"
    assert leftovers(tmp_path) == []


def test_failure_during_write_keeps_old_content_and_leaves_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "x.json"
    target.write_text("old\n")
    real_fsync = os.fsync

    def fsync_after_partial_write(fd):
        raise KeyboardInterrupt  # BaseException too: an interrupted run must not leave debris

    monkeypatch.setattr(record_mod.os, "fsync", fsync_after_partial_write)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, "x" * 100_000)
    monkeypatch.setattr(record_mod.os, "fsync", real_fsync)
    assert target.read_text() == "old\n"
    assert leftovers(tmp_path) == []


def test_unserialisable_data_leaves_target_untouched(tmp_path, monkeypatch):
    target = tmp_path / "x.json"
    target.write_text('{"old": true}\n')

    def broken_dumps(*args, **kwargs):
        raise TypeError("not JSON")

    monkeypatch.setattr(record_mod.json, "dumps", broken_dumps)
    with pytest.raises(TypeError):
        atomic_write_json(target, {"new": True})
    assert target.read_text() == '{"old": true}\n'
    assert leftovers(tmp_path) == []


def test_concurrent_writers_leave_one_complete_file(tmp_path):
    target = tmp_path / "x.json"
    payloads = [{"writer": i, "blob": str(i) * 20_000} for i in range(8)]
    barrier = threading.Barrier(len(payloads))
    errors: list[BaseException] = []

    def write(payload):
        try:
            barrier.wait()
            for _ in range(5):
                atomic_write_json(target, payload)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert json.loads(target.read_text()) in payloads
    assert leftovers(tmp_path) == []


# ---- validation and layout ------------------------------------------------------------------
@pytest.mark.parametrize("key", RECORD_KEYS)
def test_validate_rejects_each_missing_key(key):
    rec = make_record()
    del rec[key]
    with pytest.raises(ValueError, match=key):
        validate_record(rec)


def test_validate_rejects_wrong_schema_version():
    with pytest.raises(ValueError, match="schema_version"):
        validate_record({**make_record(), "schema_version": SCHEMA_VERSION + 1})
    validate_record(make_record())  # the good one passes


def test_write_record_layout(tmp_path):
    rec = make_record(cell_id="v2-FLASHINFER-p16d16-m-tp1x1", run_id="RUN1")
    path = write_record(tmp_path / "results", rec)
    assert path == tmp_path / "results" / "RUN1" / "v2-FLASHINFER-p16d16-m-tp1x1.json"
    assert json.loads(path.read_text()) == rec


def test_write_record_refuses_invalid_records(tmp_path):
    rec = make_record()
    del rec["verdict"]
    with pytest.raises(ValueError):
        write_record(tmp_path, rec)
    assert not any(tmp_path.rglob("*.json"))


# ---- loading --------------------------------------------------------------------------------
def test_load_records_orders_by_time_then_cell_and_skips_non_records(tmp_path):
    write_record(tmp_path, make_record("b-cell", "RUN2", "2026-11-02T00:00:00Z"))
    write_record(tmp_path, make_record("a-cell", "RUN2", "2026-11-02T00:00:00Z"))
    write_record(tmp_path, make_record("z-cell", "RUN1", "2026-11-01T00:00:00Z", status="FAIL"))
    (tmp_path / "RUN1" / "broken.json").write_text('{"schema_version": 1, "verd')
    (tmp_path / "RUN1" / "list.json").write_text("[1, 2]")
    (tmp_path / "RUN1" / "other.json").write_text(json.dumps({"schema_version": 1}))
    (tmp_path / "RUN1" / "old.json").write_text(json.dumps({**make_record("old"), "schema_version": 0}))
    (tmp_path / "RUN1" / "notes.txt").write_text("not json")

    records = load_records(tmp_path)
    assert [r["cell"]["id"] for r in records] == ["z-cell", "a-cell", "b-cell"]
    assert records[0]["verdict"]["status"] == "FAIL"
    assert Path(records[0]["_path"]) == tmp_path / "RUN1" / "z-cell.json"


def test_load_records_of_missing_dir_is_empty(tmp_path):
    assert load_records(tmp_path / "nope") == []


def test_committed_example_records_load():
    examples = Path(__file__).resolve().parents[1] / "data" / "records"
    records = load_records(examples)
    assert records, "tests/data/records holds example records"
    for rec in records:   # schema-1 records, read with today's names
        validate_record({**rec, "schema_version": SCHEMA_VERSION})
        assert rec["schema_version"] == 1
        assert "nixl_bytes" not in ((rec["metrics"] or {}).get("transfer") or {})


def test_a_schema_1_record_reads_with_the_connector_neutral_names(tmp_path):
    """Before the connector seam the counters and the byte check were named after NIXL."""
    old = make_record()
    old["schema_version"] = 1
    old["metrics"] = {"transfer": {"nixl_bytes": 52_428_800, "nixl_failed_transfers": 0,
                                   "nixl_transfers": 50, "requests": 50}}
    old["verdict"]["checks"] = [{"name": "nixl-bytes-exact", "passed": True, "detail": "d"}]
    atomic_write_json(tmp_path / "run" / "old.json", old)
    [loaded] = load_records(tmp_path)
    assert loaded["metrics"]["transfer"] == {"kv_bytes": 52_428_800, "failed_transfers": 0,
                                             "kv_transfers": 50, "requests": 50}
    assert loaded["verdict"]["checks"][0]["name"] == "kv-bytes-exact"
    assert SCHEMA_VERSION == 3
