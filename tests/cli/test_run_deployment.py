"""`pd-accuracy run --deployment FILE` against fake vLLM-shaped HTTP servers on 127.0.0.1: no
cell flag with it, every pre-flight problem one line and exit 2 before any question is sent
(the fakes saw no completion request), --dry-run, and one real lm-eval run through the command
whose token is sent on every request and written nowhere."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.cli.main import main
from tests.run import external_fakes as fakes_mod
from tests.run.external_fakes import SECRET


def router_deployment(tmp_path: Path, fake_vllm, **overrides) -> Path:
    baseline, router = fake_vllm("baseline", token=SECRET), fake_vllm("router", token=SECRET)
    data = {"name": "llm-d-2node", "model": "tiny", "task": "gsm_synth",
            "baseline": {"url": baseline.url, "auth_env": "PD_TOKEN"},
            "pd": {"router": router.url, "auth_env": "PD_TOKEN"},
            "metrics": {"decode": [f"{router.url}/metrics"]}, **overrides}
    return fakes_mod.write_deployment(tmp_path / "llm-d.yaml", data)


def run(path: Path, tmp_path: Path, *args: str) -> int:
    return main(["run", "--deployment", str(path), "--results-dir", str(tmp_path / "results"),
                 *args])


def error_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert all(line.startswith("pd-accuracy: error: ") for line in lines), err
    return [line[len("pd-accuracy: error: "):] for line in lines]


def asked_nothing(fake_vllm) -> bool:
    return all(server.completions() == [] for server in fake_vllm.servers)


@pytest.fixture(autouse=True)
def token(monkeypatch):
    monkeypatch.setenv("PD_TOKEN", SECRET)


# ---- flags that pick or build cells ------------------------------------------------------------
@pytest.mark.parametrize("flags, named", [
    (["--profile", "smoke"], "--profile"),
    (["--only", "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1"], "--only"),
    (["-k", "dense"], "-k"),
    (["--model", "tiny-llama-gsm"], "--model"),
    (["--block-size", "32"], "--block-size"),
    (["--fault", "drop-transfer"], "--fault"),
    (["--compile", "eager", "--tp", "2"], "--tp, --compile"),
    (["--task", "gsm8k_local"], "--task"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_cell_flag_with_deployment_is_one_line_and_exit_2(tmp_path, fake_vllm, capsys, flags, named):
    path = router_deployment(tmp_path, fake_vllm)
    assert run(path, tmp_path, *flags) == 2
    [line] = error_lines(capsys)
    assert line.startswith("--deployment judges the deployment its file describes; it does not "
                           f"combine with {named} ")
    assert all(server.requests == [] for server in fake_vllm.servers)   # not even /v1/models
    assert not (tmp_path / "results").exists()


# ---- pre-flight: before any question ----------------------------------------------------------
def test_every_endpoint_problem_is_one_line_and_no_question_is_sent(tmp_path, fake_vllm, capsys):
    baseline = fake_vllm("baseline", token=SECRET)
    router = fake_vllm("router", model="llama-8b", token=SECRET)
    dead = fakes_mod.closed_port_url()
    path = fakes_mod.write_deployment(tmp_path / "broken.yaml", {
        "model": "tiny", "baseline": {"url": dead},
        "pd": {"router": router.url, "auth_env": "PD_TOKEN"},
        "metrics": {"decode": [f"{baseline.url}/metrics"]}})
    assert run(path, tmp_path) == 2
    lines = error_lines(capsys)
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"{path}: baseline at {dead}/v1/models: unreachable: ")
    assert lines[1] == f"{path}: P/D endpoint at {router.url} serves ['llama-8b'], not 'tiny'"
    assert lines[2] == (f"{path}: decode metrics at {baseline.url}/metrics lack "
                        "vllm:nixl_bytes_transferred_sum, vllm:nixl_num_failed_transfers_total: "
                        "is it a vLLM decode server with NIXL?")
    assert asked_nothing(fake_vllm) and not (tmp_path / "results").exists()


@pytest.mark.parametrize("case", ["unreachable", "wrong-model", "metrics-missing"])
def test_each_endpoint_problem_alone(tmp_path, fake_vllm, capsys, case):
    baseline, router = fake_vllm("baseline"), fake_vllm("router", model="other" if case == "wrong-model" else "tiny")
    metrics = f"{baseline.url if case == 'metrics-missing' else router.url}/metrics"
    url = fakes_mod.closed_port_url() if case == "unreachable" else router.url
    path = fakes_mod.write_deployment(tmp_path / "d.yaml", {
        "model": "tiny", "baseline": {"url": baseline.url}, "pd": {"router": url},
        "metrics": {"decode": [metrics]}})
    assert run(path, tmp_path) == 2
    [line] = error_lines(capsys)
    expected = {"unreachable": f"P/D endpoint at {url}/v1/models: unreachable: ",
                "wrong-model": f"P/D endpoint at {url} serves ['other'], not 'tiny'",
                "metrics-missing": f"decode metrics at {metrics} lack vllm:nixl_bytes_transferred_sum"}
    assert line.startswith(f"{path}: {expected[case]}")
    assert asked_nothing(fake_vllm)


def test_an_unset_token_variable_is_one_line(tmp_path, fake_vllm, capsys, monkeypatch):
    path = router_deployment(tmp_path, fake_vllm)
    monkeypatch.delenv("PD_TOKEN")
    assert run(path, tmp_path) == 2
    lines = error_lines(capsys)
    assert lines and all("auth_env names PD_TOKEN, which is not set" in line for line in lines)
    assert asked_nothing(fake_vllm)


def test_a_malformed_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("model: tiny\nbaseline: {url: http://b:1}\npd: {router: http://r:1/v1}\n"
                    "metrics: {decode: [http://d:1/metrics]}\n")
    assert run(path, tmp_path) == 2
    [line] = error_lines(capsys)
    assert line.startswith(f"{path}: pd.router: must be the server's root URL, without /v1")


def test_a_task_without_its_documents_is_one_line(tmp_path, fake_vllm, capsys):
    path = router_deployment(tmp_path, fake_vllm, task="gsm8k_local")
    (tmp_path / "empty").mkdir()
    assert run(path, tmp_path, "--dataset-dir", str(tmp_path / "empty")) == 2
    [line] = error_lines(capsys)
    assert line.startswith(f"{path}: task gsm8k_local: ") and "does not exist" in line
    assert asked_nothing(fake_vllm)


def test_dry_run_checks_the_endpoints_and_asks_nothing(tmp_path, fake_vllm, capsys):
    path = router_deployment(tmp_path, fake_vllm)
    assert run(path, tmp_path, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "# external-llm-d-2node: tiny on gsm_synth; every endpoint answered" in out
    assert ("not checked: proxy-saw-every-question: not available with an external router"
            in out)
    assert asked_nothing(fake_vllm) and SECRET not in out


# ---- a real lm-eval run through the command ---------------------------------------------------
def test_a_run_sends_the_token_everywhere_and_writes_it_nowhere(tmp_path, fake_vllm, capsys):
    path = router_deployment(tmp_path, fake_vllm)
    junit = tmp_path / "junit.xml"
    code = run(path, tmp_path, "--limit", "5", "--max-questions", "5", "--junit-xml", str(junit))
    captured = capsys.readouterr()
    assert code == 4, captured.out[-3000:]      # 5 questions: too few to PASS at 5 points
    baseline, router = fake_vllm.servers
    asked = baseline.completions() + router.completions()
    assert len(baseline.completions()) == 10 and len(router.completions()) == 5   # + the A/A
    assert {r["authorization"] for r in asked} == {f"Bearer {SECRET}"}
    [record_path] = (tmp_path / "results").glob("*/external-llm-d-2node.json")
    record = json.loads(record_path.read_text())
    assert record["verdict"]["outcome"] == "INCONCLUSIVE"
    assert record["metrics"]["n"] == 5 and record["metrics"]["transfer"]["prompt_tokens_external"] == 50
    assert len(record["verdict"]["not_available"]) == 4
    assert "not checked: decode-got-own-params: not available with an external router" in captured.out
    assert "1 cell: 1 INCONCLUSIVE" in captured.out
    assert [c.get("name") for c in ET.parse(junit).getroot().iter("testcase")] == [
        "external-llm-d-2node"]
    assert SECRET not in captured.out + captured.err
    assert not fakes_mod.files_holding(tmp_path, SECRET)
