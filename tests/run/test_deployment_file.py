"""Deployment files: loading with one-line errors, no secrets, the pre-flight endpoint checks
(fakes, and real HTTP servers on 127.0.0.1), checks a user router cannot support, the record."""
from __future__ import annotations

import copy
import inspect
import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from jsonschema import Draft202012Validator

from harness.judge import verdict
from harness.run import deployment_file as df
from harness.run.deployment_file import (
    DeploymentError,
    Endpoint,
    check_endpoints,
    checks_not_available,
    load_deployment,
    to_record,
)

REPO = Path(__file__).resolve().parents[2]
METRICS_DATA = REPO / "tests" / "data" / "metrics"
DECODE_PAGE = (METRICS_DATA / "decode_after_pd_request.txt").read_text()
TWO_ENGINES_PAGE = (METRICS_DATA / "decode_two_engines.txt").read_text()
# the same page without any vllm: family, as a non-vLLM process would expose
NOT_VLLM_PAGE = "".join(line + "\n" for line in DECODE_PAGE.splitlines()
                        if "vllm:" not in line)
SECRET = "s3cr3t-t0ken-value"

ROUTER = {
    "model": "tiny",
    "baseline": {"url": "http://baseline:8000"},
    "pd": {"router": "http://router:8000/", "auth_env": "PD_TOKEN"},
    "metrics": {"decode": ["http://d0:8200/metrics", "http://d1:8200/metrics"]},
}
PROXY = {
    "model": "tiny",
    "task": "gsm_synth",
    "baseline": {"url": "http://baseline:8000"},
    "pd": {"router": "harness-proxy", "prefill": ["http://p0:8100"],
           "decode": ["http://d0:8200", "http://d1:8200/"]},
}


def write(tmp_path: Path, data: Any, name: str = "deploy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def load(tmp_path: Path, data: Any) -> df.ExternalDeployment:
    return load_deployment(write(tmp_path, data))


def load_error(tmp_path: Path, data: Any) -> str:
    with pytest.raises(DeploymentError) as info:
        load(tmp_path, data)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(tmp_path / "deploy.yaml") + ": ")
    return message[len(str(tmp_path / "deploy.yaml")) + 2:]


def changed(base: dict, **edits: Any) -> dict:
    """A deep copy with dotted keys set (value None: removed)."""
    data = copy.deepcopy(base)
    for dotted, value in edits.items():
        *parents, key = dotted.split("__")
        node = data
        for parent in parents:
            node = node[parent]
        if value is None:
            node.pop(key)
        else:
            node[key] = value
    return data


# ---- loading ---------------------------------------------------------------------------------
def test_schema_is_valid_draft_2020_12():
    Draft202012Validator.check_schema(df.SCHEMA)


def test_router_file_loads(tmp_path):
    dep = load(tmp_path, ROUTER)
    assert dep.name == "deploy" and dep.model == "tiny" and dep.task == "auto"
    assert dep.timeout_s == df.DEFAULT_TIMEOUT_S
    assert dep.baseline == Endpoint("http://baseline:8000")
    assert dep.router == Endpoint("http://router:8000", "PD_TOKEN")
    assert not dep.uses_harness_proxy
    assert dep.prefill == dep.decode == dep.prefill_metrics == ()
    assert [e.url for e in dep.decode_metrics] == ["http://d0:8200/metrics", "http://d1:8200/metrics"]


def test_harness_proxy_file_defaults_metrics_to_the_servers(tmp_path):
    dep = load(tmp_path, PROXY)
    assert dep.uses_harness_proxy and dep.router is None and dep.task == "gsm_synth"
    assert [e.url for e in dep.decode] == ["http://d0:8200", "http://d1:8200"]
    assert [e.url for e in dep.decode_metrics] == ["http://d0:8200/metrics", "http://d1:8200/metrics"]
    assert [e.url for e in dep.prefill_metrics] == ["http://p0:8100/metrics"]


def test_harness_proxy_file_takes_given_metrics(tmp_path):
    dep = load(tmp_path, changed(PROXY, metrics={"decode": ["http://d0:9090/metrics"],
                                                 "auth_env": "PD_METRICS_TOKEN"}))
    assert dep.decode_metrics == (Endpoint("http://d0:9090/metrics", "PD_METRICS_TOKEN"),)
    assert dep.prefill_metrics == ()


def test_every_task_the_harness_ships_is_accepted(tmp_path):
    for task in ["auto", *df.known_tasks()]:
        assert load(tmp_path, changed(ROUTER, task=task)).task == task
    assert {"gsm8k_local", "gsm_synth"} <= set(df.known_tasks())


@pytest.mark.parametrize("data, expected", [
    (changed(ROUTER, modle="tiny"),
     "unknown top-level key(s) ['modle']; known: name, model, task, kv_connector, timeout_s, baseline, pd, metrics"),
    (changed(ROUTER, baseline__port=8000), "baseline: unknown key(s) ['port']; known: url, auth_env"),
    (changed(ROUTER, model=None), "needs model, baseline and pd"),
    (changed(ROUTER, pd__router=None), "pd: needs router"),
    (changed(ROUTER, metrics=None), "needs metrics.decode: with your own router"),
    (changed(ROUTER, metrics__decode=[]), "metrics.decode: must list at least one /metrics URL"),
    (changed(ROUTER, metrics__decode="http://d0/metrics"), "metrics.decode: must be a list of /metrics URLs"),
    (changed(ROUTER, metrics__decode=["http://d/metrics", "http://d/metrics"]),
     "metrics.decode: lists a URL twice"),
    (changed(ROUTER, baseline__url="http://baseline:8000/v1"),
     "baseline.url: must be the server's root URL, without /v1"),
    (changed(ROUTER, baseline__url="baseline:8000"),
     "baseline.url: must be an http:// or https:// URL, got 'baseline:8000'"),
    (changed(ROUTER, pd__router="harness_proxy"),
     "pd.router: must be harness-proxy or your router's root URL"),
    (changed(ROUTER, pd__router="http://baseline:8000"), "pd.router: is the baseline's URL too"),
    (changed(ROUTER, pd__prefill=["http://p0:8100"]), "pd: prefill and decode go with router: harness-proxy"),
    (changed(PROXY, pd__decode=None), "pd: router: harness-proxy needs the prefill and decode server URLs"),
    (changed(PROXY, pd__decode=["http://d0:8200/v1"]), "pd.decode[0]: must be the server's root URL"),
    (changed(ROUTER, task="gsm9k"),
     "task: unknown task 'gsm9k'; the harness ships gsm8k_local, gsm8k_local_shared, gsm_synth, "
     "gsm_synth_boundary, gsm_synth_shared, or auto"),
    (changed(ROUTER, timeout_s=0), "timeout_s: must be a positive number of seconds, got 0"),
    (changed(ROUTER, timeout_s=True), "timeout_s: must be a number of seconds"),
    (changed(ROUTER, model=7), "model: must be the served model name (a string)"),
    ([ROUTER], "top level must be a mapping"),
    ("", "top level must be a mapping"),
    ("model: [tiny\nbaseline: {}\n", "not valid YAML: expected ',' or ']', but got ':' at line 2, column 9"),
    ("model: tiny\n\tpd: x\n", "not valid YAML: found character '\\t' that cannot start any token at line 2"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_is_one_line_naming_the_place(tmp_path, data, expected):
    assert load_error(tmp_path, data).startswith(expected)


@pytest.mark.parametrize("data, place", [
    (changed(ROUTER, token=SECRET), "key 'token'"),
    (changed(ROUTER, pd__api_key=SECRET), "pd: key 'api_key'"),
    (changed(ROUTER, baseline__headers={"Authorization": f"Bearer {SECRET}"}), "baseline: key 'headers'"),
    (changed(ROUTER, metrics__Authorization=f"Bearer {SECRET}"), "metrics: key 'Authorization'"),
], ids=["token", "api_key", "headers", "authorization"])
def test_a_secret_in_the_file_is_refused_without_repeating_it(tmp_path, data, place):
    message = load_error(tmp_path, data)
    assert message.startswith(f"{place}: a secret does not belong in a deployment file")
    assert "auth_env" in message and SECRET not in message


@pytest.mark.parametrize("value", [SECRET, f"Bearer {SECRET}", "pd_token", 12345])
def test_auth_env_must_be_a_variable_name_not_the_token(tmp_path, value):
    message = load_error(tmp_path, changed(ROUTER, pd__auth_env=value))
    assert message.startswith("pd.auth_env: must be the NAME of the environment variable")
    assert str(value) not in message


@pytest.mark.parametrize("field, url", [
    ("baseline__url", f"http://user:{SECRET}@baseline:8000"),
    ("pd__router", f"https://{SECRET}@router:443/v1"),
])
def test_credentials_in_a_url_are_refused_without_repeating_them(tmp_path, field, url):
    message = load_error(tmp_path, changed(ROUTER, **{field: url}))
    assert "must not hold credentials (user:password@host)" in message
    assert SECRET not in message


def test_unreadable_file_is_one_line(tmp_path):
    with pytest.raises(DeploymentError, match=r"missing\.yaml: cannot read: No such file"):
        load_deployment(tmp_path / "missing.yaml")
    assert issubclass(DeploymentError, ValueError)


def test_the_examples_in_the_docs_load(tmp_path):
    text = (REPO / "docs" / "deployment.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "\npd:" in b]
    assert len(blocks) == 3
    deps = [load_deployment(write(tmp_path, block, f"example{i}.yaml")) for i, block in enumerate(blocks)]
    assert [d.uses_harness_proxy for d in deps] == [False, False, True]


def test_the_buildkite_step_in_the_docs_is_a_valid_pipeline():
    from harness.ci.validate import validate_pipeline
    text = (REPO / "docs" / "deployment.md").read_text()
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if b.startswith("steps:")]
    validate_pipeline(yaml.safe_load(block))


# ---- check_endpoints with fakes ---------------------------------------------------------------
class FakeResponse:
    def __init__(self, status_code: int = 200, text: str = "", payload: Any = None):
        self.status_code, self.text, self._payload = status_code, text, payload

    def json(self) -> Any:
        if self._payload is None:
            raise ValueError("not JSON")
        return self._payload


def models(*names: str) -> FakeResponse:
    return FakeResponse(payload={"object": "list", "data": [{"id": n, "object": "model"} for n in names]})


class FakeGet:
    """get(url, headers, timeout): answers from a URL -> response (or exception) table; every
    other /v1/models lists 'tiny' and every other /metrics is the decode page."""

    def __init__(self, answers: dict[str, Any] | None = None):
        self.answers = answers or {}
        self.calls: list[tuple[str, dict, float]] = []

    def __call__(self, url: str, headers: dict, timeout: float) -> FakeResponse:
        self.calls.append((url, headers, timeout))
        answer = self.answers.get(url)
        if isinstance(answer, BaseException):
            raise answer
        if answer is not None:
            return answer
        return models("tiny") if url.endswith("/v1/models") else FakeResponse(text=DECODE_PAGE)


ENV = {"PD_TOKEN": SECRET}


def test_a_healthy_router_deployment_has_no_problem(tmp_path):
    get = FakeGet()
    assert check_endpoints(load(tmp_path, ROUTER), get=get, environ=ENV) == []
    assert [(url, headers) for url, headers, _ in get.calls] == [
        ("http://baseline:8000/v1/models", {}),
        ("http://router:8000/v1/models", {"Authorization": f"Bearer {SECRET}"}),
        ("http://d0:8200/metrics", {}),
        ("http://d1:8200/metrics", {}),
    ]
    assert {timeout for *_, timeout in get.calls} == {df.DEFAULT_TIMEOUT_S}


def test_harness_proxy_asks_every_server(tmp_path):
    get = FakeGet({"http://p0:8100/metrics": FakeResponse(text=TWO_ENGINES_PAGE)})
    assert check_endpoints(load(tmp_path, PROXY), get=get, environ=ENV) == []
    assert [url for url, *_ in get.calls] == [
        "http://baseline:8000/v1/models", "http://p0:8100/v1/models", "http://d0:8200/v1/models",
        "http://d1:8200/v1/models", "http://d0:8200/metrics", "http://d1:8200/metrics",
        "http://p0:8100/metrics"]


@pytest.mark.parametrize("answers, expected", [
    ({"http://router:8000/v1/models": models("x")},
     "P/D endpoint at http://router:8000 serves ['x'], not 'tiny'"),
    ({"http://baseline:8000/v1/models": models()}, "baseline at http://baseline:8000 serves [], not 'tiny'"),
    ({"http://baseline:8000/v1/models": requests.ConnectionError("refused")},
     "baseline at http://baseline:8000/v1/models: unreachable: refused"),
    ({"http://router:8000/v1/models": requests.ReadTimeout("read timed out")},
     "P/D endpoint at http://router:8000/v1/models: no answer within 10 s"),
    ({"http://router:8000/v1/models": FakeResponse(401)},
     "P/D endpoint at http://router:8000/v1/models: answered HTTP 401: is auth_env naming the right variable?"),
    ({"http://baseline:8000/v1/models": FakeResponse(404)},
     "baseline at http://baseline:8000/v1/models: answered HTTP 404"),
    ({"http://baseline:8000/v1/models": FakeResponse(text="<html>")},
     "baseline at http://baseline:8000/v1/models: not an OpenAI model list"),
    ({"http://baseline:8000/v1/models": FakeResponse(payload={"data": "tiny"})},
     "baseline at http://baseline:8000/v1/models: not an OpenAI model list"),
    ({"http://d1:8200/metrics": FakeResponse(text=NOT_VLLM_PAGE)},
     "decode metrics at http://d1:8200/metrics lack vllm:prompt_tokens_by_source_total, "
     "vllm:nixl_bytes_transferred_sum, vllm:nixl_num_failed_transfers_total: "
     "is it a vLLM decode server with NIXL?"),
    ({"http://d0:8200/metrics": FakeResponse(text="<html><body>" + "x" * 500 + "</body></html>")},
     "decode metrics at http://d0:8200/metrics: not Prometheus text (invalid metric name:<html><body>xxx"),
    ({"http://d0:8200/metrics": requests.ConnectionError("refused")},
     "decode metrics at http://d0:8200/metrics: unreachable: refused"),
], ids=["wrong-model", "no-model", "unreachable", "timeout", "unauthorized", "not-found",
        "not-json", "not-a-list", "metrics-missing", "not-prometheus", "metrics-unreachable"])
def test_each_endpoint_problem_is_one_line(tmp_path, answers, expected):
    [problem] = check_endpoints(load(tmp_path, ROUTER), get=FakeGet(answers), environ=ENV)
    assert problem.startswith(expected)
    assert "\n" not in problem and len(problem) < 300 and SECRET not in problem


def test_a_decode_page_without_nixl_names_only_what_is_missing(tmp_path):
    page = "".join(line + "\n" for line in DECODE_PAGE.splitlines() if "nixl" not in line)
    [problem] = check_endpoints(load(tmp_path, ROUTER), environ=ENV,
                                get=FakeGet({"http://d0:8200/metrics": FakeResponse(text=page)}))
    assert problem == ("decode metrics at http://d0:8200/metrics lack vllm:nixl_bytes_transferred_sum, "
                       "vllm:nixl_num_failed_transfers_total: is it a vLLM decode server with NIXL?")


def test_prefill_metrics_need_only_vllm(tmp_path):
    data = changed(ROUTER, metrics__prefill=["http://p0:8100/metrics"])
    get = FakeGet({"http://p0:8100/metrics": FakeResponse(text=NOT_VLLM_PAGE)})
    [problem] = check_endpoints(load(tmp_path, data), get=get, environ=ENV)
    assert problem == ("prefill metrics at http://p0:8100/metrics lack "
                       "vllm:prompt_tokens_by_source_total: is it a vLLM server?")


def test_problems_of_several_endpoints_are_all_reported(tmp_path):
    get = FakeGet({"http://router:8000/v1/models": models("x"),
                   "http://d1:8200/metrics": FakeResponse(500)})
    problems = check_endpoints(load(tmp_path, ROUTER), get=get, environ=ENV)
    assert problems == ["P/D endpoint at http://router:8000 serves ['x'], not 'tiny'",
                        "decode metrics at http://d1:8200/metrics: answered HTTP 500"]


def test_an_unset_auth_env_is_reported_and_nothing_is_sent_without_it(tmp_path):
    get = FakeGet()
    [problem] = check_endpoints(load(tmp_path, ROUTER), get=get, environ={})
    assert problem == ("P/D endpoint at http://router:8000: auth_env names PD_TOKEN, which is not "
                       "set in this environment")
    assert "http://router:8000/v1/models" not in [url for url, *_ in get.calls]


def test_the_timeout_comes_from_the_file(tmp_path):
    get = FakeGet()
    check_endpoints(load(tmp_path, changed(ROUTER, timeout_s=2.5)), get=get, environ=ENV)
    assert {timeout for *_, timeout in get.calls} == {2.5}


# ---- check_endpoints against real HTTP servers ------------------------------------------------
@pytest.fixture
def serve(fake_http):
    """serve(models, metrics_text, token=None) -> root URL of a server on 127.0.0.1."""
    def start(models: list[str], metrics_text: str, token: str | None = None) -> str:
        def respond(request: dict) -> tuple:
            if token and request["authorization"] != f"Bearer {token}":
                return 401, "unauthorized"
            if request["path"] == "/v1/models":
                return 200, {"object": "list", "data": [{"id": m, "object": "model"}
                                                        for m in models]}
            if request["path"] == "/metrics":
                return 200, metrics_text, "text/plain; version=0.0.4"
            return 404, "not found"

        return fake_http(respond).url

    start.servers = fake_http.servers
    return start


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_http_servers(tmp_path, serve, monkeypatch):
    baseline = serve(["tiny"], NOT_VLLM_PAGE)
    router = serve(["tiny"], "", token=SECRET)
    decode = serve(["tiny"], DECODE_PAGE)
    decode2 = serve(["tiny"], TWO_ENGINES_PAGE)
    data = {"model": "tiny", "timeout_s": 5,
            "baseline": {"url": baseline}, "pd": {"router": router, "auth_env": "PD_TOKEN"},
            "metrics": {"decode": [f"{decode}/metrics", f"{decode2}/metrics"]}}
    monkeypatch.setenv("PD_TOKEN", SECRET)
    assert check_endpoints(load(tmp_path, data)) == []
    assert [r["authorization"] for r in serve.servers[1].requests] == [f"Bearer {SECRET}"]
    assert [r["authorization"] for r in serve.servers[0].requests] == [None]

    wrong_model = serve(["other"], "")
    port = closed_port()
    broken = dict(data, baseline={"url": wrong_model},
                  metrics={"decode": [f"{baseline}/metrics", f"http://127.0.0.1:{port}/metrics"]})
    monkeypatch.setenv("PD_TOKEN", "wrong")
    problems = check_endpoints(load(tmp_path, broken))
    assert problems[:3] == [
        f"baseline at {wrong_model} serves ['other'], not 'tiny'",
        f"P/D endpoint at {router}/v1/models: answered HTTP 401: is auth_env naming the right variable?",
        f"decode metrics at {baseline}/metrics lack vllm:prompt_tokens_by_source_total, "
        "vllm:nixl_bytes_transferred_sum, vllm:nixl_num_failed_transfers_total: "
        "is it a vLLM decode server with NIXL?"]
    assert problems[3].startswith(f"decode metrics at http://127.0.0.1:{port}/metrics: unreachable: ")
    assert "Connection refused" in problems[3] and " object at 0x" not in problems[3]
    assert len(problems) == 4 and all("\n" not in p and SECRET not in p for p in problems)


# ---- what a user router cannot support, and the record ----------------------------------------
def test_checks_not_available_with_a_user_router(tmp_path):
    lines = checks_not_available(load(tmp_path, ROUTER))
    assert [line.split(":")[0] for line in lines] == [
        "proxy-saw-every-question", "prefill-returned-params", "decode-got-params", "decode-got-own-params"]
    assert all(": not available with an external router (" in line for line in lines)


def test_checks_not_available_with_the_harness_proxy(tmp_path):
    assert checks_not_available(load(tmp_path, PROXY)) == []


def test_the_proxy_only_checks_are_verdict_checks():
    source = inspect.getsource(verdict.transfer_checks)
    for name in df.PROXY_ONLY_CHECKS:
        assert f'Check("{name}"' in source


def test_the_record_keeps_env_names_never_values(tmp_path, monkeypatch):
    monkeypatch.setenv("PD_TOKEN", SECRET)
    monkeypatch.setenv("PD_METRICS_TOKEN", SECRET)
    data = changed(ROUTER, baseline__auth_env="PD_BASELINE_TOKEN", metrics__auth_env="PD_METRICS_TOKEN")
    record = to_record(load(tmp_path, data))
    text = json.dumps(record)
    assert SECRET not in text
    assert record["baseline"] == {"url": "http://baseline:8000", "auth_env": "PD_BASELINE_TOKEN"}
    assert record["pd"] == {"router": {"url": "http://router:8000", "auth_env": "PD_TOKEN"},
                            "prefill": [], "decode": []}
    assert record["metrics"]["decode"][0] == {"url": "http://d0:8200/metrics", "auth_env": "PD_METRICS_TOKEN"}
    assert record["checks_not_available"] == list(df.PROXY_ONLY_CHECKS)
    assert record["model"] == "tiny" and record["task"] == "auto" and record["name"] == "deploy"


def test_the_record_of_a_harness_proxy_deployment(tmp_path):
    record = to_record(load(tmp_path, changed(PROXY, pd__auth_env="PD_TOKEN")))
    assert record["pd"]["router"] == "harness-proxy"
    assert record["pd"]["decode"] == [{"url": "http://d0:8200", "auth_env": "PD_TOKEN"},
                                      {"url": "http://d1:8200", "auth_env": "PD_TOKEN"}]
    assert record["checks_not_available"] == []
    assert json.loads(json.dumps(record)) == record
