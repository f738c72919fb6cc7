"""evaluate.py without servers: task materialisation, lm-eval samples → QuestionRecords, and the
capturing completions model (payload + captured choices, also through lm-eval's own request loop
against a local fake /v1/completions)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from harness.eval.lmeval import (
    DATA_DIR_TOKEN, DatasetNotFound, EvalRun, QuestionRecord, _capturing_lm_class,
    _questions_from_samples, materialize_task, prompt_hash,
)
from tests.http_fakes import FakeHttp

GEN_KWARGS = {"until": ["Question:", "</s>", "<|im_end|>"], "do_sample": False, "temperature": 0.0}


# ---- materialize_task ------------------------------------------------------------------------
@pytest.fixture
def gsm_dir(tmp_path) -> Path:
    d = tmp_path / "gsm8k"
    d.mkdir()
    for split in ("train", "test"):
        (d / f"{split}.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    return d


def test_materialize_task_fills_the_data_dir(gsm_dir, tmp_path):
    out = materialize_task("gsm8k_local", gsm_dir, tmp_path / "tasks")
    text = (out / "gsm8k_local.yaml").read_text()
    assert DATA_DIR_TOKEN not in text
    cfg = yaml.safe_load(text)
    assert cfg["task"] == "gsm8k_local"
    assert cfg["dataset_kwargs"]["data_files"] == {"train": f"{gsm_dir.resolve()}/train.jsonl",
                                                   "test": f"{gsm_dir.resolve()}/test.jsonl"}


@pytest.mark.parametrize("case", ["no-dir", "missing-dir", "missing-split", "unknown-task"])
def test_materialize_task_errors_are_one_clear_line(case, gsm_dir, tmp_path):
    task, data = "gsm8k_local", gsm_dir
    if case == "no-dir":
        data = None
    elif case == "missing-dir":
        data = tmp_path / "nowhere"
    elif case == "missing-split":
        (gsm_dir / "train.jsonl").unlink()
    else:
        task = "no_such_task"
    with pytest.raises(DatasetNotFound) as info:
        materialize_task(task, data, tmp_path / "tasks")
    message = str(info.value)
    assert "\n" not in message and message
    expected = {"no-dir": "--dataset-dir", "missing-dir": "nowhere/train.jsonl does not exist",
                "missing-split": "train.jsonl does not exist",
                "unknown-task": "unknown task 'no_such_task'"}[case]
    assert expected in message
    if case == "unknown-task":
        assert "gsm8k_local" in message     # says what the harness ships


# ---- samples → QuestionRecords ------------------------------------------------------------------
FEWSHOT = "Question: 3+4?\nAnswer: 3+4=7\n#### 7\n\n"


def sample(doc_id: int, filter_name: str, generated: str, extracted: str, exact: float,
           target: str) -> dict:
    """One entry of lm-eval 0.4.13's results["samples"][task] for a generate_until task."""
    prompt = f"{FEWSHOT}Question: q{doc_id}?\nAnswer:"
    return {
        "doc_id": doc_id,
        "doc": {"question": f"q{doc_id}?", "answer": target},
        "target": target,
        "arguments": [[prompt, dict(GEN_KWARGS)]],
        "resps": [[generated]],
        "filtered_resps": [extracted],
        "filter": filter_name,
        "metrics": ["exact_match"],
        "doc_hash": "d", "prompt_hash": "p", "target_hash": "t",
        "exact_match": exact,
    }


def realistic_samples() -> list[dict]:
    return [
        # doc 1: right answer in the strict format
        sample(1, "strict-match", " 2+2=4\n#### 4", "4", 1.0, "2+2=4\n#### 4"),
        sample(1, "flexible-extract", " 2+2=4\n#### 4", "4", 1.0, "2+2=4\n#### 4"),
        # doc 0: right number but no '####': strict misses, flexible finds it
        sample(0, "flexible-extract", " The answer is 12.", "12.", 1.0, "#### 12"),
        sample(0, "strict-match", " The answer is 12.", "[invalid]", 0.0, "#### 12"),
        # doc 2: wrong
        sample(2, "strict-match", " #### 5", "5", 0.0, "#### 6"),
        sample(2, "flexible-extract", " #### 5", "5", 0.0, "#### 6"),
    ]


def test_questions_from_samples_maps_both_filters_and_logprobs():
    samples = realistic_samples()
    lp = {"tokens": [" 2", "+"], "token_logprobs": [-0.1, -0.2], "top_logprobs": [{" 2": -0.1},
                                                                                   {"+": -0.2}]}
    captured = {prompt_hash(samples[0]["arguments"][0][0]):
                {"text": " 2+2=4\n#### 4", "finish_reason": "stop", "logprobs": lp}}
    qs = _questions_from_samples(samples, captured)
    assert [q.doc_id for q in qs] == [0, 1, 2]
    q0, q1, q2 = qs
    assert (q0.correct, q0.correct_flexible) == (False, True)
    assert (q0.answer_strict, q0.answer_flexible) == ("[invalid]", "12.")
    assert (q1.correct, q1.correct_flexible) == (True, True)
    assert (q2.correct, q2.correct_flexible) == (False, False)
    assert q1.generated == " 2+2=4\n#### 4" and q1.target == "2+2=4\n#### 4"
    assert q1.prompt_hash == prompt_hash(f"{FEWSHOT}Question: q1?\nAnswer:")
    assert q1.logprobs == lp and q1.finish_reason == "stop"
    assert q0.logprobs is None and q0.finish_reason is None     # nothing captured for it


def test_questions_from_a_single_filter_task():
    samples = [{**s, "filter": "none"} for s in realistic_samples() if s["filter"] == "strict-match"]
    qs = _questions_from_samples(samples, {})
    assert [q.correct for q in qs] == [q.correct_flexible for q in qs] == [False, True, False]


def test_eval_run_jsonl_round_trip(tmp_path):
    qs = _questions_from_samples(realistic_samples(), {})
    ev = EvalRun(role="baseline", base_url="u", task="gsm8k_local", n=3, accuracy=1 / 3,
                 accuracy_flexible=2 / 3, wall_s=0.1, questions=tuple(qs))
    path = ev.write_jsonl(tmp_path / "s.jsonl")
    back = [QuestionRecord(**json.loads(line)) for line in path.read_text().splitlines()]
    assert back == qs
    assert ev.by_doc()[2] is qs[2]


# ---- the capturing model ----------------------------------------------------------------------
def completion(texts: list[str], with_logprobs: bool = True) -> dict:
    """An OpenAI /v1/completions response as vLLM returns it."""
    return {
        "id": "cmpl-1", "object": "text_completion", "model": "m",
        "choices": [{
            "index": i, "text": t, "finish_reason": "stop", "stop_reason": None,
            "logprobs": {"tokens": [t], "token_logprobs": [-0.5 - i], "text_offset": [0],
                         "top_logprobs": [{t: -0.5 - i, "x": -3.0}]} if with_logprobs else None,
        } for i, t in enumerate(texts)],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
    }


def make_lm(**kwargs):
    lm_cls = _capturing_lm_class()
    return lm_cls(tokenizer_backend=None, base_url="http://127.0.0.1:1/v1/completions",
                  model="m", **kwargs)


def test_generate_payload_asks_for_logprobs_only_when_wanted():
    lm = make_lm()
    assert "logprobs" not in lm._create_payload("p", generate=True, gen_kwargs=dict(GEN_KWARGS))
    lm.top_logprobs = 5
    payload = lm._create_payload("p", generate=True, gen_kwargs=dict(GEN_KWARGS))
    assert payload["logprobs"] == 5 and payload["prompt"] == "p" and payload["temperature"] == 0.0
    # loglikelihood payloads keep lm-eval's own logprobs=1 / echo
    ll = lm._create_payload("p", generate=False)
    assert ll["logprobs"] == 1 and ll["echo"] is True


def test_parse_generations_captures_choices_by_prompt_hash():
    lm = make_lm()
    lm.top_logprobs = 5
    lm._create_payload("prompt A", generate=True, gen_kwargs=dict(GEN_KWARGS))
    texts = lm.parse_generations(outputs=completion([" #### 4"]))
    assert texts == [" #### 4"]
    cap = lm.captured[prompt_hash("prompt A")]
    assert cap["text"] == " #### 4" and cap["finish_reason"] == "stop"
    assert cap["logprobs"]["token_logprobs"] == [-0.5]


def test_an_answers_own_draft_acceptance_is_kept_for_one_prompt_only():
    """vLLM's metrics.speculative_decoding belongs to the response's one sequence: kept with
    its question; a batch of prompts shares one response, so none is kept."""
    acceptance = {"acceptance_histogram": [3, 1, 2], "num_draft_tokens": 12, "num_spec_tokens": 2}
    lm = make_lm()
    lm._create_payload("prompt A", generate=True, gen_kwargs=dict(GEN_KWARGS))
    lm.parse_generations(outputs={**completion([" #### 4"]),
                                  "metrics": {"speculative_decoding": acceptance}})
    assert lm.captured[prompt_hash("prompt A")]["spec"] == acceptance
    lm._create_payload(["p0", "p1"], generate=True, gen_kwargs=dict(GEN_KWARGS))
    lm.parse_generations(outputs={**completion(["a", "b"]),
                                  "metrics": {"speculative_decoding": acceptance}})
    assert lm.captured[prompt_hash("p0")]["spec"] is None
    lm._create_payload("plain", generate=True, gen_kwargs=dict(GEN_KWARGS))
    lm.parse_generations(outputs=completion(["c"]))
    assert lm.captured[prompt_hash("plain")]["spec"] is None


@pytest.mark.parametrize("batch", [list, tuple])
def test_batched_prompts_are_captured_per_choice_index(batch):
    # lm-eval hands a batch of contexts as a tuple (zip) when batch_size > 1
    lm = make_lm()
    lm._create_payload(batch(["p0", "p1"]), generate=True, gen_kwargs=dict(GEN_KWARGS))
    out = completion(["a", "b"])
    out["choices"].reverse()                       # the server may answer out of order
    assert lm.parse_generations(outputs=out) == ["a", "b"]
    assert lm.captured[prompt_hash("p0")]["text"] == "a"
    assert lm.captured[prompt_hash("p1")]["text"] == "b"


def test_concurrent_requests_do_not_mix_prompts():
    lm = make_lm()

    async def one(prompt: str, answer: str, delay: float) -> None:
        lm._create_payload(prompt, generate=True, gen_kwargs=dict(GEN_KWARGS))
        await asyncio.sleep(delay)                 # the other request's payload is built meanwhile
        lm.parse_generations(outputs=completion([answer]))

    async def both() -> None:
        await asyncio.gather(asyncio.create_task(one("first", "A", 0.02)),
                             asyncio.create_task(one("second", "B", 0.0)))

    asyncio.run(both())
    assert lm.captured[prompt_hash("first")]["text"] == "A"
    assert lm.captured[prompt_hash("second")]["text"] == "B"


def test_parse_without_a_generate_payload_captures_nothing():
    lm = make_lm()
    assert lm.parse_generations(outputs=completion(["x"])) == ["x"]
    assert lm.captured == {}


# ---- through lm-eval's own request loop, against a local fake server --------------------------
def _answer_completions(request: dict) -> tuple:
    body = request["body"]
    prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
    return 200, completion([f" answer to {p[-2:]}" for p in prompts],
                           with_logprobs="logprobs" in body)


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeHttp]:
    with FakeHttp(_answer_completions) as server:
        yield server


@pytest.mark.parametrize("num_concurrent,batch_size", [(1, 1), (3, 1), (1, 2)])
def test_generate_until_captures_every_prompt(fake_server, num_concurrent, batch_size):
    from lm_eval.api.instance import Instance

    url, bodies = f"{fake_server.url}/v1/completions", fake_server.requests
    bodies.clear()
    lm_cls = _capturing_lm_class()
    lm = lm_cls(tokenizer_backend=None, base_url=url, model="m", tokenized_requests=False,
                num_concurrent=num_concurrent, batch_size=batch_size, max_retries=1, timeout=10)
    lm.top_logprobs = 3
    prompts = [f"Question: q{i}?\nAnswer: {i:02d}" for i in range(5)]
    requests_ = [Instance("generate_until", doc={}, arguments=(p, dict(GEN_KWARGS)), idx=0)
                 for p in prompts]
    texts = lm.generate_until(requests_, disable_tqdm=True)
    assert texts == [f" answer to {p[-2:]}" for p in prompts]
    assert len(bodies) == (3 if batch_size == 2 else 5)
    assert all(b["logprobs"] == 3 for b in fake_server.bodies())
    assert set(lm.captured) == {prompt_hash(p) for p in prompts}
    for p in prompts:
        cap = lm.captured[prompt_hash(p)]
        assert cap["text"] == f" answer to {p[-2:]}"
        assert cap["logprobs"]["tokens"] == [cap["text"]]
