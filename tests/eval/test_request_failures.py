"""Error answers never become wrong answers: lm-eval's own request loop against a local fake
/v1/completions that answers some prompts with vLLM's HTTP 500 (a failed KV load under
kv_load_failure_policy "fail") or an HTTP 200 whose finish_reason is "error"; every question
is still asked, then evaluate_endpoint raises RequestsFailed."""
from __future__ import annotations

import json
from typing import Iterator

import pytest

from harness.eval import lmeval
from harness.eval.lmeval import RequestsFailed, _capturing_lm_class, prompt_hash
from tests.http_fakes import FakeHttp

GEN_KWARGS = {"until": ["Question:"], "do_sample": False, "temperature": 0.0}
# what vLLM 0.32's exception handler answers for a GenerationError (finish_reason "error")
VLLM_500 = {"error": {"message": "Internal server error", "type": "InternalServerError",
                      "param": None, "code": 500}}


def _flaky(request: dict) -> tuple:
    prompt = request["body"]["prompt"]
    if "fail" in prompt:
        return 500, VLLM_500
    return 200, {"id": "c", "object": "text_completion", "model": "m",
                 "choices": [{"index": 0, "text": " #### 4", "logprobs": None,
                              "finish_reason": "error" if "error" in prompt else "stop"}]}


@pytest.fixture(scope="module")
def flaky_server() -> Iterator[tuple[str, FakeHttp]]:
    with FakeHttp(_flaky) as server:
        yield f"{server.url}/v1/completions", server


PROMPTS = ["Question: ok 1?", "Question: fail 2?", "Question: ok 3?", "Question: error 4?",
           "Question: fail 5?", "Question: ok 6?"]


def test_every_question_is_asked_and_each_error_kept(flaky_server):
    from lm_eval.api.instance import Instance

    url, server = flaky_server
    server.requests.clear()
    lm = _capturing_lm_class()(tokenizer_backend=None, base_url=url, model="m",
                               tokenized_requests=False, num_concurrent=3, max_retries=1,
                               timeout=10)
    requests_ = [Instance("generate_until", doc={}, arguments=(p, dict(GEN_KWARGS)), idx=0)
                 for p in PROMPTS]
    texts = lm.generate_until(requests_, disable_tqdm=True)
    asked = [body["prompt"] for body in server.bodies()]
    assert sorted(asked) == sorted(PROMPTS)                 # nothing left unasked
    assert texts == ["" if "fail" in p else " #### 4" for p in PROMPTS]
    assert sorted(lm.request_failures) == sorted(
        ["HTTP 500 Internal Server Error"] * 2 + ['finish_reason "error"'])
    assert lm.captured[prompt_hash(PROMPTS[3])]["finish_reason"] == "error"


def test_requests_failed_is_one_line_with_the_counts():
    exc = RequestsFailed(["HTTP 500 Internal Server Error"] * 3 + ['finish_reason "error"'], 50)
    assert str(exc) == ('requests failed on 4 of 50 questions: HTTP 500 Internal Server Error x3, '
                        'finish_reason "error" x1')
    assert exc.questions == 50 and len(exc.failures) == 4


def test_evaluate_endpoint_raises_after_the_evaluation(monkeypatch, tmp_path):
    """The wiring: lm-eval finishes (its samples are there), the errors it kept fail the run."""
    import lm_eval

    data = tmp_path / "gsm8k"
    data.mkdir()
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text(json.dumps({"question": "q", "answer": "#### 4"}) + "\n")
    prompt = "Question: q?\nAnswer:"
    samples = [{"doc_id": 0, "filter": "strict-match", "target": "#### 4",
                "arguments": [[prompt, dict(GEN_KWARGS)]], "resps": [[""]],
                "filtered_resps": ["[invalid]"], "exact_match": 0.0}]

    def simple_evaluate(*, model, tasks, **kwargs):
        model.request_failures.append("HTTP 500 Internal Server Error")
        return {"samples": {tasks[0]: samples}}

    monkeypatch.setattr(lm_eval, "simple_evaluate", simple_evaluate)
    with pytest.raises(RequestsFailed, match="requests failed on 1 of 1 questions: HTTP 500"):
        lmeval.evaluate_endpoint(role="pd", base_url="http://127.0.0.1:1", served_model_name="m",
                                 task="gsm8k_local", data_dir=data, limit=1, work_dir=tmp_path)
