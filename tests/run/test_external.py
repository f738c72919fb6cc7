"""An external deployment judged as one cell (harness.run.external), against fake vLLM-shaped
HTTP servers on 127.0.0.1 and, with router: harness-proxy, the harness's real proxy process:
the verdict, the record, the checks a user router cannot support, the Authorization header sent
and never written, and the record rendered by the annotation and the HTML report."""
from __future__ import annotations

import json
from pathlib import Path

from harness.core.options import RunOptions
from harness.judge.verdict import Policy
from harness.run import external
from harness.run.deployment_file import (PROXY_ONLY_CHECKS, check_endpoints, checks_not_available,
                                         load_deployment)
from harness.run.external import ExternalCell, ExternalRun, ModelFacts, cell_id_for, model_facts
from harness.run.runner import Runner

from tests.run.external_fakes import SECRET, FakeEvaluate, files_holding, write_deployment

FACTS = ModelFacts(task="gsm_synth", data_dir=None, hybrid=False, reference=None)
ENV = {"PD_TOKEN": SECRET}
METRIC_CHECKS = {"kv-arrived-externally", "decode-did-not-recompute", "no-failed-transfers"}


def make_runner(tmp_path: Path, progress: list[str] | None = None, **options) -> Runner:
    opts = RunOptions(**{"limit": 20, "max_questions": 40, "margin": 0.3, "concurrency": 2,
                         "results_dir": str(tmp_path / "runs"), **options})
    return Runner(opts, Policy.from_options(opts), run_id="run-1",
                  progress=(progress if progress is not None else []).append)


def router_file(tmp_path: Path, fake_vllm, **router_options) -> Path:
    baseline = fake_vllm("baseline", token=SECRET)
    router = fake_vllm("router", token=SECRET, **router_options)
    return write_deployment(tmp_path / "llm-d.yaml", {
        "name": "llm-d-2node", "model": "tiny", "task": "gsm_synth",
        "baseline": {"url": baseline.url, "auth_env": "PD_TOKEN"},
        "pd": {"router": router.url, "auth_env": "PD_TOKEN"},
        "metrics": {"decode": [f"{router.url}/metrics"]}})


def judge(tmp_path: Path, path: Path, evaluate: FakeEvaluate | None = None, **options):
    dep = load_deployment(path)
    assert check_endpoints(dep, environ=ENV) == []
    runner = make_runner(tmp_path, **options)
    results = ExternalRun(dep, runner, environ=ENV, evaluate=evaluate or FakeEvaluate(),
                          facts=FACTS).run()
    return dep, runner, results


# ---- identity --------------------------------------------------------------------------------
def test_the_cell_id_names_the_deployment():
    assert cell_id_for("llm-d-h200-2node") == "external-llm-d-h200-2node"
    assert cell_id_for("my deploy/2 nodes") == "external-my-deploy-2-nodes"
    assert cell_id_for("///") == "external-deployment"
    cell = ExternalCell(name="x", model="org/Model-8B")
    assert (cell.fault, cell.expected_failure, cell.is_canary) == (None, None, False)
    assert cell.to_dict()["id"] == "external-x" and cell.model_short == "Model-8B"


def test_model_facts_come_from_the_zoo_for_a_zoo_model(tmp_path):
    def dep(model, task="auto"):
        return load_deployment(write_deployment(tmp_path / "d.yaml", {
            "model": model, "task": task, "baseline": {"url": "http://b:1"},
            "pd": {"router": "harness-proxy", "prefill": ["http://p:1"], "decode": ["http://d:1"]}}))

    dense = model_facts(dep("tiny-llama-gsm"))
    assert dense.task == "gsm_synth" and not dense.hybrid and dense.reference is not None
    assert model_facts(dep("tiny-granite-hybrid-gsm")).hybrid
    unknown = model_facts(dep("llama-8b"), dataset_dir="/data/gsm8k")
    assert unknown == ModelFacts("gsm8k_local", "/data/gsm8k", False, None)
    assert model_facts(dep("tiny-llama-gsm", task="gsm8k_local")).task == "gsm8k_local"


# ---- the harness proxy in front of the user's servers -----------------------------------------
def test_harness_proxy_deployment_is_judged_with_every_check(tmp_path, fake_vllm):
    baseline, prefill, decode = (fake_vllm(role, token=SECRET) for role in ("baseline", "prefill", "decode"))
    path = write_deployment(tmp_path / "two-node.yaml", {
        "model": "tiny", "task": "gsm_synth", "baseline": {"url": baseline.url, "auth_env": "PD_TOKEN"},
        "pd": {"router": "harness-proxy", "prefill": [prefill.url], "decode": [decode.url],
               "auth_env": "PD_TOKEN"}})
    evaluate = FakeEvaluate()
    dep, runner, [result] = judge(tmp_path, path, evaluate)

    assert result.verdict.outcome == "PASS", result.verdict.reason
    record = json.loads(result.record_path.read_text())
    assert result.record_path == tmp_path / "runs" / "run-1" / "external-two-node.json"
    assert record["cell"]["id"] == "external-two-node" and record["cell"]["external"] is True
    assert record["cell"]["deployment"]["pd"]["router"] == "harness-proxy"
    checks = {c["name"]: c["passed"] for c in record["verdict"]["checks"]}
    assert set(PROXY_ONLY_CHECKS) | METRIC_CHECKS <= set(checks) and all(checks.values())
    assert record["verdict"]["not_available"] == []
    # every P/D question went through the harness's proxy: both hops, with the token
    pd_calls = [c for c in evaluate.calls if c["role"] == "pd"]
    assert pd_calls and all(c["base_url"] not in (prefill.url, decode.url) for c in pd_calls)
    n = record["metrics"]["n"]
    assert len(decode.completions()) == len(prefill.completions()) == n
    assert all(r["body"]["kv_transfer_params"] == PARAMS_SENT for r in decode.completions())
    assert {r["authorization"] for r in prefill.completions() + decode.completions()
            + baseline.completions()} == {f"Bearer {SECRET}"}
    proxy_records = (tmp_path / "runs" / "run-1" / "external-two-node" / "proxy-records.jsonl")
    assert len(proxy_records.read_text().splitlines()) == n == record["metrics"]["transfer"]["requests"]
    assert record["artifacts"]["proxy_records"] == "external-two-node/proxy-records.jsonl"
    assert not files_holding(tmp_path / "runs", SECRET)


PARAMS_SENT = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "engine-p0",
               "remote_block_ids": [1, 2], "remote_host": "127.0.0.1", "remote_port": 5600}


# ---- a user router ----------------------------------------------------------------------------
def test_a_user_router_lists_the_proxy_checks_as_not_available(tmp_path, fake_vllm):
    dep, runner, [result] = judge(tmp_path, router_file(tmp_path, fake_vllm))
    assert result.verdict.outcome == "PASS", result.verdict.reason
    record = json.loads(result.record_path.read_text())
    names = [c["name"] for c in record["verdict"]["checks"]]
    assert METRIC_CHECKS <= set(names) and not set(PROXY_ONLY_CHECKS) & set(names)
    assert record["verdict"]["not_available"] == checks_not_available(dep)
    assert all(": not available with an external router (" in line
               for line in record["verdict"]["not_available"])
    transfer = record["metrics"]["transfer"]
    assert transfer["requests"] == record["metrics"]["n"]       # from vllm:request_success_total
    assert transfer["requests_with_params"] is None and transfer["requests_own_params"] is None
    assert transfer["prompt_tokens_external"] == 10 * record["metrics"]["n"]
    assert record["cell"]["deployment"]["checks_not_available"] == list(PROXY_ONLY_CHECKS)
    assert "proxy_records" not in record["artifacts"]
    assert not files_holding(tmp_path / "runs", SECRET)


def test_a_router_whose_decode_recomputes_fails_on_the_metrics(tmp_path, fake_vllm):
    _, _, [result] = judge(tmp_path, router_file(tmp_path, fake_vllm, transfer=False))
    assert result.verdict.outcome == "FAIL"
    assert result.verdict.reason.startswith("decode recomputed the prompt: no KV crossed")
    assert len(result.verdict.not_available) == len(PROXY_ONLY_CHECKS)


def test_a_worse_pd_endpoint_fails_on_accuracy(tmp_path, fake_vllm):
    worse = FakeEvaluate(correct=lambda role, doc: role != "pd" or doc % 2 == 0)
    _, _, [result] = judge(tmp_path, router_file(tmp_path, fake_vllm), worse)
    assert result.verdict.outcome == "FAIL"
    assert result.verdict.reason.startswith("P/D accuracy is lower")


def test_an_undecided_deployment_is_asked_more_questions(tmp_path, fake_vllm):
    progress: list[str] = []
    dep = load_deployment(router_file(tmp_path, fake_vllm))
    runner = make_runner(tmp_path, progress, margin=0.05, limit=10, max_questions=20)
    [result] = ExternalRun(dep, runner, environ=ENV, evaluate=FakeEvaluate(), facts=FACTS).run()
    looks = result.record["metrics"]["sequential"]["looks"]
    assert [look["n"] for look in looks] == [10, 20]
    assert result.verdict.outcome == "INCONCLUSIVE"
    assert [line for line in progress if line.startswith("evaluating P/D")] == [
        f"evaluating P/D external-llm-d-2node at {dep.router.url} ({n} questions)" for n in (10, 20)]


def test_every_repeat_is_a_record_of_its_own(tmp_path, fake_vllm):
    _, _, results = judge(tmp_path, router_file(tmp_path, fake_vllm), repeats=2)
    assert [r.record_path.parent.name for r in results] == ["run-1-r00", "run-1-r01"]
    assert [r.verdict.outcome for r in results] == ["PASS", "PASS"]


# ---- failures ---------------------------------------------------------------------------------
def test_a_baseline_that_fails_is_an_error_and_pd_is_not_asked(tmp_path, fake_vllm):
    baseline = fake_vllm("baseline", completion_status=500)
    router = fake_vllm("router")
    path = write_deployment(tmp_path / "d.yaml", {
        "model": "tiny", "baseline": {"url": baseline.url}, "pd": {"router": router.url},
        "metrics": {"decode": [f"{router.url}/metrics"]}})
    _, _, [result] = judge(tmp_path, path)
    assert result.verdict.outcome == "ERROR"
    assert result.verdict.reason.startswith("baseline evaluation failed: HTTPError: 500")
    assert router.completions() == []
    assert result.record["verdict"]["not_available"] == checks_not_available(load_deployment(path))


def test_a_pd_endpoint_that_fails_is_a_fail(tmp_path, fake_vllm):
    _, _, [result] = judge(tmp_path, router_file(tmp_path, fake_vllm, completion_status=503))
    assert result.verdict.outcome == "FAIL"
    assert result.verdict.reason.startswith("P/D evaluation failed: HTTPError: 503")
    assert [c["name"] for c in result.record["verdict"]["checks"]] == ["pd-requests"]


def test_a_token_in_an_error_message_is_not_written(tmp_path, fake_vllm):
    def leaky(**kwargs):
        if kwargs["role"] == "pd":
            raise RuntimeError(f"upstream said: bad header Bearer {SECRET}")
        return FakeEvaluate()(**kwargs)

    _, _, [result] = judge(tmp_path, router_file(tmp_path, fake_vllm), leaky)
    assert result.verdict.reason == ("P/D evaluation failed: RuntimeError: upstream said: bad "
                                     "header Bearer ***")
    assert not files_holding(tmp_path / "runs", SECRET)


# ---- what reads records -----------------------------------------------------------------------
def test_the_annotation_and_the_report_render_an_external_record(tmp_path, fake_vllm):
    from harness.report.annotate import annotate
    from harness.report.history import append_results_dir
    from harness.report.html import render_report

    judge(tmp_path, router_file(tmp_path, fake_vllm))
    note = annotate(tmp_path / "runs", tmp_path / "annotation.md", agent=False)
    text = note.path.read_text()
    assert note.cells == 1 and "external-llm-d-2node" in text and "PASS" in text
    assert append_results_dir(tmp_path / "history.db", tmp_path / "runs") == 1
    index = render_report(tmp_path / "history.db", tmp_path / "report")
    assert "external-llm-d-2node" in index.read_text()

