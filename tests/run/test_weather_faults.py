"""The fault weathers (expiry, load-failures, aborts): their rows' rules both ways, what they
change in the servers and tag in the proxy, and their events and conditions on a made-up run
(records, /metrics, server logs), both ways."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.cell import Cell
from harness.core.platform import PlatformInfo
from harness.weathers import resolved_params
from harness.judge.weather import IDENTICAL, MISSING, RequestRow, silent_wrong
from harness.matrix import load_matrix
from harness.matrix.rules import check_cell
from harness.run.weather import weather_for
from harness.run.weather.base import WeatherRun
from harness.run.weather_eval import with_events


def weather_tag(cell: Cell) -> str:
    """The proxy's request tag of `cell`'s weather ("" when it tags nothing)."""
    params = resolved_params(cell.weather, cell.weather_settings)
    return weather_for(cell.weather).workload(cell, params).request_tag or ""
from harness.weathers.expiry.protocol import HELD_PREFIX
from harness.serve.proxy.hops import new_request_id, tag_for

CPU = PlatformInfo()
CATALOG = load_matrix().models
CELL = Cell(model="tiny-llama-gsm")
FAULT_WEATHERS = ("expiry", "load-failures", "aborts")


def invalid(cell: Cell) -> list[str]:
    return [p.message for p in check_cell(cell, CPU, CATALOG) if p.kind == "invalid"]


@pytest.mark.parametrize("name", FAULT_WEATHERS)
def test_rules_both_ways(name):
    assert not invalid(CELL.replace(weather=name))
    assert not invalid(CELL.replace(weather=name, weather_params=(("share", 1.0),)))
    assert any("share must be 0–1" in m
               for m in invalid(CELL.replace(weather=name, weather_params=(("share", 1.2),))))


@pytest.mark.parametrize("name, param, value", [
    ("expiry", "lease_s", 0), ("expiry", "lease_s", 1.5), ("aborts", "lease_s", 31),
    ("load-failures", "recompute", 2)])
def test_out_of_bounds_parameters_are_refused(name, param, value):
    assert invalid(CELL.replace(weather=name, weather_params=((param, value),)))


def test_lease_weathers_need_the_pull_connector():
    for name in ("expiry", "aborts"):
        assert any("cannot be produced with kv_connector nixl-push" in m
                   for m in invalid(CELL.replace(weather=name, kv_connector="nixl-push")))
    assert not invalid(CELL.replace(weather="load-failures", kv_connector="nixl-push"))


def changes(name: str, **params):
    cell = CELL.replace(weather=name, weather_params=tuple(params.items()))
    return weather_for(name).servers(cell, resolved_params(name, cell.weather_settings)), cell


def test_expiry_leases_both_sides_and_arms_the_decode_only():
    servers, cell = changes("expiry", lease_s=3)
    assert dict(servers["prefill"].kv_connector_extra) == {"kv_lease_duration": 3}
    assert dict(servers["decode"].extra_env) == {"PD_ACCURACY_FAULT": "by-request"}
    assert not servers["prefill"].extra_env
    assert weather_tag(cell) == "wx.late-read.5000.@0.25"       # lease + 2 s


def test_load_failures_sets_the_decodes_policy():
    fail, cell = changes("load-failures")
    recompute, _ = changes("load-failures", recompute=1, share=1.0)
    assert dict(fail["decode"].kv_transfer) == {"kv_load_failure_policy": "fail"}
    assert dict(recompute["decode"].kv_transfer) == {"kv_load_failure_policy": "recompute"}
    assert "prefill" not in fail
    assert weather_tag(cell) == "fault.fail-transfer.first.zero.@0.25"
    assert weather_tag(cell.replace(weather_params=(("share", 1.0),))) == \
        "fault.fail-transfer.first.zero."


def test_calm_tags_nothing():
    assert weather_tag(CELL) == ""


def tagged_id(cell: Cell) -> str:
    tag = weather_tag(cell).partition("@")[0]
    return new_request_id(tag)


def make_run(cell: Cell, records, rows, before, after, tmp_path: Path, decode_log: str = ""):
    log = tmp_path / "decode-0.log"
    log.write_text(decode_log)
    return WeatherRun(cell=cell, params=resolved_params(cell.weather, cell.weather_settings),
                      rows=tuple(rows), proxy_records=tuple(records), metrics_before=before,
                      metrics_after=after, logs={"decode-0": str(log)})


def row(rid, status=200, digest=IDENTICAL, correct=True, **kw):
    return RequestRow(request_id=rid, doc_id=1, prompt_hash="h", status=status,
                      error=None if status == 200 else "HTTP 500", digest=digest,
                      correct=correct, baseline_correct=True, **kw)


def conditions(name, cell, run):
    return {c.name: c.passed for c in weather_for(name).conditions(run)}


def expiry_run(cell, records, tmp_path, held, expired, counted):
    import dataclasses

    run = make_run(cell, records, [], {"prefill-0": {"vllm:nixl_num_kv_expired_reqs_total": 1}},
                   {"prefill-0": {"vllm:nixl_num_kv_expired_reqs_total": 1 + counted}}, tmp_path,
                   "\n".join(f"WARNING {HELD_PREFIX} held request=cmpl-{r}-0-ab delay_ms=4000 "
                             f"heartbeat=stopped" for r in held))
    prefill_log = tmp_path / "prefill-0.log"
    prefill_log.write_text("\n".join(
        f"WARNING [base_worker.py:3032] Releasing expired KV blocks for request cmpl-{r}-0-9c "
        f"which were retrieved by 0 remote worker(s) before lease expired." for r in expired))
    return dataclasses.replace(run, logs={**run.logs, "prefill-0": str(prefill_log)})


def test_expiry_accounts_every_expired_request_and_the_prefills_count(tmp_path):
    cell = CELL.replace(weather="expiry")
    late = [tagged_id(cell) for _ in range(3)]
    lapsed, calm = new_request_id(), new_request_id()
    records = [{"request_id": r, "decode_status": 200} for r in late + [lapsed, calm]]
    good = expiry_run(cell, records, tmp_path, late, late + [lapsed], 4)
    assert conditions("expiry", cell, good) == {
        "reads-held": True, "delayed-expired": True, "expired-count": True}
    events = weather_for("expiry").events(good)
    assert [(e.kind, e.request_id) for e in events] == (
        [("read-after-lease", r) for r in late] + [("lease-expired", lapsed)])
    assert all(e.may_fail for e in events)
    miscounted = expiry_run(cell, records, tmp_path, late, late + [lapsed], 3)
    assert conditions("expiry", cell, miscounted)["expired-count"] is False
    unexpired = expiry_run(cell, records, tmp_path, late, late[:2], 2)
    got = conditions("expiry", cell, unexpired)
    assert got["delayed-expired"] is False and got["expired-count"] is True
    unheld = expiry_run(cell, records, tmp_path, [], late, 3)
    assert conditions("expiry", cell, unheld)["reads-held"] is False


def fault_line(rid: str) -> str:
    return (f"WARNING pd-accuracy fault: fault=fail-transfer request=cmpl-{rid}-0 "
            f"block_ids=[[1,2]] layers=0")


@pytest.mark.parametrize("recompute", [0, 1])
def test_load_failures_holds_under_each_policy_and_not_the_other(tmp_path, recompute):
    cell = CELL.replace(weather="load-failures", weather_params=(("recompute", recompute),))
    failed = [tagged_id(cell) for _ in range(2)]
    records = [{"request_id": r, "decode_status": 500 - 300 * recompute} for r in failed]
    sample = "vllm:nixl_num_failed_transfers_total"
    log = "\n".join(fault_line(r) for r in failed)
    status = 200 if recompute else 500
    right_rows = [row(r, status=status, digest=MISSING) for r in failed]
    wrong_rows = [row(r, status=700 - status, digest=MISSING) for r in failed]
    after = {"decode-0": {sample: 2}}
    right = make_run(cell, records, right_rows, {}, after, tmp_path, log)
    policy = "policy-recompute" if recompute else "policy-fail"
    assert conditions("load-failures", cell, right) == {
        "reads-failed": True, "failed-transfers-counted": True, policy: True}
    wrong = make_run(cell, records, wrong_rows, {}, {"decode-0": {sample: 1}}, tmp_path, log)
    assert conditions("load-failures", cell, wrong) == {
        "reads-failed": True, "failed-transfers-counted": False, policy: False}
    events = weather_for("load-failures").events(right)
    assert all(e.may_fail is (not recompute) and e.recomputed is bool(recompute) for e in events)
    accounted = set(weather_for("load-failures").accounted_checks(right.params))
    assert ("decode-did-not-recompute" in accounted) is bool(recompute)
    assert ("kv-digest" in accounted) is bool(recompute)
    assert {"no-failed-transfers", "kv-bytes-exact"} <= accounted


def test_a_recomputed_200_is_judged_by_its_answer_not_its_missing_digest(tmp_path):
    cell = CELL.replace(weather="load-failures", weather_params=(("recompute", 1),))
    rid = tagged_id(cell)
    run = make_run(cell, [{"request_id": rid, "decode_status": 200}], [], {}, {}, tmp_path)
    events = weather_for("load-failures").events(run)
    right = with_events((row(rid, digest=MISSING),), events)
    wrong = with_events((row(rid, digest=MISSING, correct=False),), events)
    assert right[0].recomputed and not silent_wrong(right)
    assert silent_wrong(wrong) == list(wrong)
    untagged = (row(new_request_id(), digest=MISSING),)     # no event: a missing digest is wrong
    assert silent_wrong(with_events(untagged, events)) == list(untagged)


def test_aborts_wants_every_phase_and_idle_caches(tmp_path):
    from harness.weathers.aborts.protocol import PHASES

    cell = CELL.replace(weather="aborts")
    records = [{"request_id": tagged_id(cell), "abort_phase": p} for p in PHASES]
    usage = "vllm:kv_cache_usage_perc"
    idle = {"prefill-0": {usage: 0.0}, "decode-0": {usage: 0.0}}
    run = make_run(cell, records, [], {}, idle, tmp_path)
    assert all(conditions("aborts", cell, run).values())
    assert len(weather_for("aborts").events(run)) == 4
    assert weather_for("aborts").settle_s(run.params) == 8.0      # lease 5 + 3
    held = make_run(cell, records[:3], [], {}, {**idle, "prefill-0": {usage: 0.004}}, tmp_path)
    got = conditions("aborts", cell, held)
    assert got["phases"] is False and got["kv-idle[prefill-0]"] is False
    assert got["kv-idle[decode-0]"] is True


def test_the_share_picks_the_same_prompts_each_run():
    cell = CELL.replace(weather="aborts")
    tag = weather_tag(cell)
    picks = [tag_for(tag, {"prompt": f"q{i}"}) for i in range(100)]
    assert picks == [tag_for(tag, {"prompt": f"q{i}"}) for i in range(100)]
    assert 10 < sum(bool(p) for p in picks) < 45


# ---------------------------------------------------------------- restart

def iso(t: float) -> str:
    import datetime as dt
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat()


def restart_run(tmp_path, timeline, records):
    cell = CELL.replace(weather="restart")
    run = make_run(cell, records, [], {}, {}, tmp_path)
    import dataclasses
    return cell, dataclasses.replace(run, timeline=tuple(timeline))


def rec(start: float, ms: float, ok: bool = True) -> dict:
    return {"request_id": new_request_id(), "started_at": iso(start), "prefill_ms": ms / 2,
            "decode_ms": ms / 2, "decode_status": 200 if ok else None,
            "error": None if ok else "prefill: unreachable"}


def test_restart_accounts_requests_in_flight_at_each_kill(tmp_path):
    t = 1_000_000.0
    timeline = [("prefill:kill", t + 10), ("prefill:healthy", t + 40),
                ("decode:kill", t + 50), ("decode:healthy", t + 80)]
    before, hit_p, after_p = rec(t, 1000), rec(t + 9.5, 1000, ok=False), rec(t + 41, 1000)
    hit_d, after_d = rec(t + 49, 2000, ok=False), rec(t + 81, 500)
    cell, run = restart_run(tmp_path, timeline, [before, hit_p, after_p, hit_d, after_d])
    events = weather_for("restart").events(run)
    assert {(e.kind, e.request_id) for e in events} == {
        ("prefill-killed", hit_p["request_id"]), ("decode-killed", hit_d["request_id"])}
    assert all(conditions("restart", cell, run).values())
    late_wrong = rec(t + 85, 500, ok=False)
    _, bad = restart_run(tmp_path, timeline, [before, hit_p, after_p, hit_d, after_d, late_wrong])
    got = conditions("restart", cell, bad)
    assert got["answered-after[decode]"] is False and got["answered-after[prefill]"] is False
    _, quiet = restart_run(tmp_path, timeline[:2] + [("error: ServerStartTimeout: x", t + 90)],
                           [before])
    got = conditions("restart", cell, quiet)
    assert got["restarted"] is False and got["traffic[prefill]"] is False


def test_restart_kills_and_relaunches_each_role_behind_a_hold(monkeypatch):
    from harness.weathers.restart import driver as restart

    calls: list[str] = []

    class Pair:
        def kill(self, role):
            calls.append(f"kill {role}")

        def relaunch(self, role):
            calls.append(f"relaunch {role}")

    monkeypatch.setattr(restart.exact_headers, "post",
                        lambda url, timeout: calls.append(url.rsplit("/", 1)[-1]))
    monkeypatch.setattr(restart.time, "sleep", lambda s: None)
    disturbance = weather_for("restart").disturbance(CELL, resolved_params("restart", {}))
    timeline = disturbance.start(Pair(), "http://proxy").finish(5)
    assert calls == ["hold", "kill prefill", "relaunch prefill", "release",
                     "hold", "kill decode", "relaunch decode", "release"]
    assert [what for what, _ in timeline] == ["prefill:kill", "prefill:healthy",
                                              "decode:kill", "decode:healthy"]


def test_a_failed_relaunch_still_releases_and_is_on_the_timeline(monkeypatch):
    from harness.weathers.restart import driver as restart

    posts: list[str] = []

    class Pair:
        def kill(self, role):
            pass

        def relaunch(self, role):
            raise RuntimeError("port taken")

    monkeypatch.setattr(restart.exact_headers, "post",
                        lambda url, timeout: posts.append(url.rsplit("/", 1)[-1]))
    monkeypatch.setattr(restart.time, "sleep", lambda s: None)
    timeline = weather_for("restart").disturbance(CELL, resolved_params("restart", {})).start(
        Pair(), "http://proxy").finish(5)
    assert posts == ["hold", "release"]
    assert timeline[-1][0] == "error: RuntimeError: port taken"


def test_a_weather_may_account_the_aggregate_kv_digest_and_only_then():
    # load-failures under recompute: the recomputed requests have no decode digest
    from dataclasses import replace

    from harness.core.outcomes import FAIL
    from harness.judge.verdict import decide
    from harness.judge.weather import WeatherJudgement
    from tests.judge.test_verdict import comparison, digest_summary, proof

    short = comparison(transfer=proof(kv_digest=digest_summary(compared=40)))
    judged = WeatherJudgement("load-failures", {}, (row("r1"),), (), (), 0, ())
    failed = decide(short, weather=judged)
    assert failed.status == FAIL and "[kv-digest]" in failed.reason
    accounted = decide(short, weather=replace(judged, accounted_checks={"kv-digest": "recomputed"}))
    assert "kv-digest" not in [c.name for c in accounted.checks]
    assert any(n.startswith("kv-digest: accounted per request") for n in accounted.not_available)
