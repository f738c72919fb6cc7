"""Error answers never become wrong answers: lm-eval's own request loop against a local fake
/v1/completions that answers some prompts with vLLM's HTTP 500 (a failed KV load under
kv_load_failure_policy "fail") or an HTTP 200 whose finish_reason is "error"; every question
is still asked, then evaluate_endpoint raises RequestsFailed."""
from __future__ import annotations

import http.server
import json
import threading
from typing import Iterator

import pytest

from harness.eval import lmeval
from harness.eval.lmeval import RequestsFailed, _capturing_lm_class, prompt_hash

GEN_KWARGS = {"until": ["Question:"], "do_sample": False, "temperature": 0.0}
# what vLLM 0.32's exception handler answers for a GenerationError (finish_reason "error")
VLLM_500 = {"error": {"message": "Internal server error", "type": "InternalServerError",
                      "param": None, "code": 500}}


class _FlakyCompletions(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.prompts.append(body["prompt"])  # type: ignore[attr-defined]
        status, finish, answer = 200, "stop", {}
        if "fail" in body["prompt"]:
            status, answer = 500, VLLM_500
        elif "error" in body["prompt"]:
            finish = "error"
        if not answer:
            answer = {"id": "c", "object": "text_completion", "model": "m",
                      "choices": [{"index": 0, "text": " #### 4", "finish_reason": finish,
                                   "logprobs": None}]}
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def flaky_server() -> Iterator[tuple[str, list]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FlakyCompletions)
    server.prompts = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/completions", server.prompts  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


PROMPTS = ["Question: ok 1?", "Question: fail 2?", "Question: ok 3?", "Question: error 4?",
           "Question: fail 5?", "Question: ok 6?"]


def test_every_question_is_asked_and_each_error_kept(flaky_server):
    from lm_eval.api.instance import Instance

    url, prompts = flaky_server
    prompts.clear()
    lm = _capturing_lm_class()(tokenizer_backend=None, base_url=url, model="m",
                               tokenized_requests=False, num_concurrent=3, max_retries=1,
                               timeout=10)
    requests_ = [Instance("generate_until", doc={}, arguments=(p, dict(GEN_KWARGS)), idx=0)
                 for p in PROMPTS]
    texts = lm.generate_until(requests_, disable_tqdm=True)
    assert sorted(prompts) == sorted(PROMPTS)               # nothing left unasked
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
