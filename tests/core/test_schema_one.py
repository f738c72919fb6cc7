"""The one translation of schema-1 names (NIXL was the only connector) to today's."""
from __future__ import annotations

from harness.core.schema_one import counter_names, history_migration, with_todays_names


def test_a_schema_1_record_gets_todays_counter_and_check_names():
    old = {"metrics": {"transfer": {"nixl_bytes": 7, "nixl_expired_requests": 1, "requests": 2}},
           "verdict": {"check": "nixl-bytes-exact",
                       "checks": [{"name": "nixl-bytes-exact"}, {"name": "accuracy"}]}}
    new = with_todays_names(old)
    assert new["metrics"]["transfer"] == {"kv_bytes": 7, "expired_requests": 1, "requests": 2}
    assert new["verdict"]["check"] == "kv-bytes-exact"
    assert [c["name"] for c in new["verdict"]["checks"]] == ["kv-bytes-exact", "accuracy"]


def test_todays_names_and_odd_shapes_pass_unchanged():
    assert counter_names({"kv_bytes": 1}) == {"kv_bytes": 1}
    assert with_todays_names({"metrics": None, "verdict": "ERROR"}) == {"metrics": None,
                                                                       "verdict": "ERROR"}


def test_the_history_store_renames_its_one_column():
    assert history_migration() == ("ALTER TABLE cells RENAME COLUMN nixl_bytes TO kv_bytes",)
