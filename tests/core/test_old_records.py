"""The one translation of older records' names (schema 1: NIXL was the only connector;
schema 2: the soak was the only request series) to today's."""
from __future__ import annotations

from harness.core.old_records import counter_names, history_migration, with_todays_names


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


def test_a_schema_2_soak_record_gets_todays_series_names():
    """Before parallel-sampling sent its children as a series, the series was the soak's."""
    old = {"metrics": {"weather": {"weather": "soak", "soak": {"windows": [{"first": 0}]},
                                   "rows": [{"soak_index": 3, "agrees": True}, "odd"]}},
           "verdict": {"check": "soak-trend",
                       "checks": [{"name": "soak-trend"}, {"name": "silent-wrong-answers"}]}}
    new = with_todays_names(old)
    weather = new["metrics"]["weather"]
    assert "soak" not in weather and weather["series"] == {"windows": [{"first": 0}]}
    assert weather["weather"] == "soak"       # the weather's own name stays
    assert weather["rows"] == [{"series_index": 3, "agrees": True}, "odd"]
    assert new["verdict"]["check"] == "agreement-trend"
    assert [c["name"] for c in new["verdict"]["checks"]] == ["agreement-trend",
                                                             "silent-wrong-answers"]
