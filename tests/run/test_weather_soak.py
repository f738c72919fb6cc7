"""The soak's driver and its late fault: requests through a proxy, cycling the look's questions
with a cache_salt each, answers compared with the baseline's; a fault tag from the proxy's
(N+1)-th request on. Fakes only for the harness's own request loop; the real soak is in
results/reference/cpu-soak-20261205."""
from __future__ import annotations

import pytest

from harness.cli.main import main
from harness.core.cell import Cell
from harness.weathers import resolved_params
from harness.judge.weather import IDENTICAL
from harness.run.weather import weather_for
from harness.run.weather.base import SeriesQuestion
from harness.weathers.soak.driver import SoakDriver, soak_requests, strict_answer
from harness.run.weather_eval import with_digests
from harness.protocol.faults import AFTER_ENV, SHARE_ENV, request_tag_for
from harness.serve.proxy.hops import tag_for
from tests.http_fakes import FakeHttp


def test_a_fault_tag_starts_after_the_nth_request():
    tag = request_tag_for("corrupt-block", ((AFTER_ENV, "400"),))
    assert tag == "fault.corrupt-block.first.zero.@after=400"
    tags = [tag_for(tag, {"prompt": f"q{i % 7}"}, index=i) for i in range(800)]
    assert tags[:400] == [""] * 400 and set(tags[400:]) == {"fault.corrupt-block.first.zero."}
    both = request_tag_for("corrupt-block", ((SHARE_ENV, "0.5"), (AFTER_ENV, "10")))
    assert both.endswith("@0.5,after=10")
    late = [tag_for(both, {"prompt": f"q{i}"}, index=i) for i in range(400)]
    assert not any(late[:10]) and 100 < sum(bool(t) for t in late[10:]) < 290
    with pytest.raises(ValueError, match="whole number"):
        request_tag_for("corrupt-block", ((AFTER_ENV, "soon"),))


def test_fault_after_is_in_the_cell_id_and_bad_values_exit_2(capsys):
    cell = Cell(model="tiny-llama-gsm", fault="corrupt-block", weather="soak",
                extra_env=((AFTER_ENV, "400"),))
    assert cell.cell_id.endswith("-w_soak-fault-corrupt-block-after400")
    assert main(["run", "--model", "tiny-llama-gsm", "--fault", "corrupt-block",
                 "--fault-after", "later", "--dry-run"]) == 2
    assert "--fault-after: must be a whole number" in capsys.readouterr().err


def test_the_soak_defaults_by_device_and_sizes_servers_like_load():
    soak = weather_for("soak")
    cpu = Cell(model="tiny-llama-gsm", weather="soak")
    params = resolved_params("soak", {})
    assert soak_requests(cpu, params) == 2000
    assert soak_requests(Cell(model="tiny-llama-gsm", device="cuda", weather="soak"), params) == 20000
    assert soak_requests(cpu, {**params, "requests": 300}) == 300
    servers = soak.servers(cpu, params)
    assert servers["decode"].num_blocks == 48 and servers["prefill"].prefix_caching
    assert soak.workload(cpu, params).in_flight == 64 and soak.workload(cpu, params).request_tag is None
    failing = {**params, "fail_share": 0.1}
    assert soak.workload(cpu, failing).request_tag == "fault.fail-transfer.first.zero.@0.1"
    assert ("PD_ACCURACY_FAULT", "by-request") in soak.servers(cpu, failing)["decode"].extra_env
    assert set(soak.accounted_checks(failing)) == {"no-failed-transfers", "kv-bytes-exact"}


def test_the_driver_cycles_questions_salts_each_request_and_compares_answers():
    def respond(request):
        prompt = request["body"]["prompt"]
        if prompt == "broken":
            return 500, {"error": "engine died"}
        return 200, {"choices": [{"text": f"so #### {'7' if prompt == 'q1' else '9'}",
                                  "finish_reason": "stop"}]}

    questions = [SeriesQuestion(1, {"model": "m", "prompt": "q1", "max_tokens": 8}, "7"),
                 SeriesQuestion(2, {"model": "m", "prompt": "q2", "max_tokens": 8}, "8"),
                 SeriesQuestion(3, {"model": "m", "prompt": "broken", "max_tokens": 8}, "1")]
    with FakeHttp(respond) as fake:
        rows = SoakDriver(requests=9, in_flight=4, window=3).run(fake.url, questions)
        bodies = fake.bodies("/v1/completions")
    assert [r.series_index for r in rows] == list(range(9))
    assert [r.doc_id for r in rows] == [1, 2, 3] * 3
    assert [r.agrees for r in rows] == [True, False, None] * 3
    assert [r.status for r in rows] == [200, 200, 500] * 3 and "HTTP 500" in rows[2].error
    salts = {b["cache_salt"] for b in bodies}
    assert len(salts) == 9 and all(b["max_tokens"] == 8 for b in bodies)
    # the witness adds each one's digest from the proxy's records (none here: missing)
    joined = with_digests(rows[:1], {"x": (IDENTICAL, "")}, [])
    assert joined[0].digest == "missing"


def test_strict_answer_is_lm_evals_gsm8k_filter():
    assert strict_answer("3 + 4 = 7\n#### 7") == "7"
    assert strict_answer("no answer") == "[invalid]"


def test_the_soak_asks_every_question_of_the_look_with_the_baselines_answer():
    from dataclasses import replace

    from harness.core.prompts import prompt_hash
    from harness.judge.weather import RequestRow
    from harness.run.weather_eval import series_questions
    from tests.run.test_weather_eval import q, run

    pd = run(q(1), q(2, error="HTTP 500 x"))
    pd = replace(pd, payloads={prompt_hash("Q1"): {"prompt": "Q1"}, prompt_hash("Q2"): {"prompt": "Q2"}})
    asked = series_questions(pd, run(q(1), q(2, correct=False)))
    # the failed one too: a fault by prompt hash (fail_share) must meet it again in the soak
    assert [(s.doc_id, s.payload["prompt"]) for s in asked] == [(1, "Q1"), (2, "Q2")]
    row = RequestRow("pdacc-s", 1, None, 200, None, "missing", series_index=0, agrees=True)
    joined = with_digests((row,), {"pdacc-s": (IDENTICAL, "")},
                          [{"request_id": "pdacc-s", "prompt_hash": "h1"}])
    assert (joined[0].digest, joined[0].prompt_hash) == (IDENTICAL, "h1")


def test_the_soak_blew_when_every_block_recycled_tenfold_and_every_request_went(tmp_path):
    from harness.judge.weather import RequestRow
    from harness.run.weather.base import WeatherRun
    from tests.run.test_weather_eval import _record

    soak = weather_for("soak")
    cell = Cell(model="m", weather="soak")
    params = resolved_params("soak", {"requests": 3, "fail_share": 0.5})
    logs = {}
    for name in ("prefill-0", "decode-0"):
        (tmp_path / name).write_text("CPU KV cache size: 6,144 tokens")
        logs[name] = str(tmp_path / name)
    sample = "vllm:kv_block_lifetime_seconds_count"
    after = {"prefill-0": {sample: 48 * 12}, "decode-0": {sample: 48 * 5}}   # 12x and 5x
    rows = tuple(RequestRow(f"s{i}", 1, None, 200, None, IDENTICAL, series_index=i) for i in range(3))
    records = tuple({**_record(0.01 * i, 2000), "request_id": f"pdacc-fault.fail-transfer.first.zero.{i}",
                     "decode_status": 500 if i else 200} for i in range(64))
    run = WeatherRun(cell, params, rows, records, {}, after, logs)
    conds = {c.name: c for c in soak.conditions(run)}
    assert conds["blocks-recycled[prefill-0]"].passed
    assert not conds["blocks-recycled[decode-0]"].passed and "wanted >= 10x" in conds[
        "blocks-recycled[decode-0]"].detail
    assert conds["soak-requests"].passed and "3, wanted 3" in conds["soak-requests"].detail
    # one tagged request answered 200: a failed read must never be
    assert not conds["failed-reads-loud"].passed and "63, wanted 64" in conds["failed-reads-loud"].detail
    assert len(soak.events(run)) == 64
