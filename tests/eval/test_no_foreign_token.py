"""No request of the harness carries an Authorization it was not given: with $OPENAI_API_KEY set
(lm-eval's fallback) and a ~/.netrc naming the host (requests' fallback), a local fake endpoint
that answers 401 to any Authorization other than the one the test chose sees none of them."""
from __future__ import annotations

import pytest
from tests.http_fakes import FakeHttp

from harness.core import exact_headers
from harness.eval.lmeval import _capturing_lm_class
from harness.run.deployment_file import Endpoint, check_endpoints, load_deployment

USERS_KEY = "sk-users-own-openai-key-0123456789"
GEN_KWARGS = {"until": ["Question:"], "do_sample": False, "temperature": 0.0}


def strict_endpoint(allowed: str | None):
    """A server that fails the test's request on any Authorization but `allowed`."""
    def respond(request: dict) -> tuple:
        if request["authorization"] != allowed:
            return 401, {"error": f"unexpected Authorization {request['authorization']!r}"}
        if request["path"] == "/v1/models":
            return 200, {"object": "list", "data": [{"id": "m"}]}
        return 200, {"id": "c", "object": "text_completion", "model": "m",
                     "choices": [{"index": 0, "text": " #### 4", "logprobs": None,
                                  "finish_reason": "stop"}]}
    return FakeHttp(respond)


@pytest.fixture(autouse=True)
def hostile_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", USERS_KEY)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login user password netrc-password\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))


@pytest.mark.parametrize("concurrency", [1, 3], ids=["sync-requests", "async-aiohttp"])
@pytest.mark.parametrize("given", [None, "Bearer pd-token"], ids=["no-auth-env", "auth-env"])
def test_lm_eval_sends_exactly_the_given_authorization(concurrency, given):
    from lm_eval.api.instance import Instance

    with strict_endpoint(given) as server:
        lm = _capturing_lm_class()(tokenizer_backend=None, base_url=f"{server.url}/v1/completions",
                                   model="m", tokenized_requests=False,
                                   num_concurrent=concurrency, max_retries=1, timeout=10)
        lm.request_headers = {"Authorization": given} if given else {}
        prompts = ["Question: 1?", "Question: 2?"]
        texts = lm.generate_until(
            [Instance("generate_until", doc={}, arguments=(p, dict(GEN_KWARGS)), idx=0)
             for p in prompts], disable_tqdm=True)
        assert [r["authorization"] for r in server.requests] == [given, given]
        assert lm.request_failures == [] and texts == [" #### 4"] * 2


@pytest.mark.parametrize("given", [None, "Bearer pd-token"])
def test_probes_and_scrapes_send_exactly_the_given_authorization(given):
    with strict_endpoint(given) as server:
        response = exact_headers.get(f"{server.url}/v1/models",
                                     headers={"Authorization": given} if given else None,
                                     timeout=5)
        assert response.status_code == 200
        assert [r["authorization"] for r in server.requests] == [given]


def test_preflight_without_auth_env_sends_no_token(tmp_path):
    with strict_endpoint(None) as baseline, strict_endpoint(None) as router:
        path = tmp_path / "d.yaml"
        path.write_text(f"model: m\ntask: gsm_synth\nbaseline: {{url: '{baseline.url}'}}\n"
                        f"pd: {{router: '{router.url}'}}\n"
                        f"metrics: {{decode: ['{router.url}/metrics']}}\n")
        dep = load_deployment(path)
        check_endpoints(dep)   # /metrics answers 200 too: its parse problem is not the point
        seen = baseline.requests + router.requests
        assert seen and all(r["authorization"] is None for r in seen)


def test_a_token_in_a_url_is_refused_before_it_is_sent():
    with strict_endpoint(None) as server:
        with pytest.raises(ValueError, match="token in its query") as info:
            exact_headers.get(f"{server.url}/metrics?access_token=sk-abcdefgh123", timeout=5)
        assert "sk-abcdefgh123" not in str(info.value)
        assert server.requests == []
    assert Endpoint("http://h/x").headers({"OPENAI_API_KEY": USERS_KEY}) == {}
