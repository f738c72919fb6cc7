"""Fakes for the external-deployment tests (tests/run/test_external*.py, tests/cli/test_run_deployment.py):
OpenAI/vLLM-shaped HTTP servers on 127.0.0.1 that serve /v1/models, /metrics and
/v1/completions and keep every request with its Authorization header, and an evaluation that
asks them one question per document (lm-eval itself is exercised by the tests that need it)."""
from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any, Callable

import requests
import yaml

from harness.eval.lmeval import EvalRun, QuestionRecord, prompt_hash
from tests.http_fakes import FakeHttp

SECRET = "s3cr3t-t0ken-for-external"
PROMPT_TOKENS = 10        # each fake completion counts this many prompt tokens
NIXL_BYTES = 4096         # and moves this many bytes when the KV "crossed"
PARAMS = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "engine-p0",
          "remote_block_ids": [1, 2], "remote_host": "127.0.0.1", "remote_port": 5600}


class FakeVllm(FakeHttp):
    """One fake server. role: baseline | prefill | decode | router (a router is a decode server
    that does the hand-off itself). transfer=False: decode/router recompute every prompt."""

    def __init__(self, role: str, model: str = "tiny", token: str | None = None,
                 transfer: bool = True, completion_status: int = 200) -> None:
        self.role, self.model, self.token = role, model, token
        self.transfer, self.completion_status = transfer, completion_status
        self.counters = {"local_compute": 0.0, "local_cache_hit": 0.0, "external_kv_transfer": 0.0,
                         "kv_bytes": 0.0, "nixl_count": 0.0, "success": 0.0}
        self.lock = threading.Lock()
        super().__init__(self.answer)

    def answer(self, request: dict[str, Any]) -> tuple:
        """vLLM's --api-key guards the /v1 routes only (its /metrics stays open)."""
        path = request["path"]
        if (self.token and path.startswith("/v1/")
                and request["authorization"] != f"Bearer {self.token}"):
            return 401, {"error": "unauthorized"}
        if request["method"] == "GET" and path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        if request["method"] == "GET" and path == "/metrics":
            return 200, self.metrics_text(), "text/plain; version=0.0.4"
        if request["method"] != "POST" or path != "/v1/completions":
            return 404, {"error": "not found"}
        if self.completion_status != 200:
            return self.completion_status, {"error": "broken"}
        return 200, self.complete(request["body"] or {})

    def completions(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"] == "/v1/completions"]

    def metrics_text(self) -> str:
        c = self.counters
        lines = [f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="{self.model}",'
                 f'source="{source}"}} {c[source]}'
                 for source in ("local_compute", "local_cache_hit", "external_kv_transfer")]
        lines.append(f'vllm:request_success_total{{engine="0",finished_reason="stop",'
                     f'model_name="{self.model}"}} {c["success"]}')
        if self.role in ("decode", "router"):
            lines += [f'vllm:nixl_bytes_transferred_sum{{engine="0",model_name="{self.model}"}} '
                      f'{c["kv_bytes"]}',
                      f'vllm:nixl_bytes_transferred_count{{engine="0",model_name="{self.model}"}} '
                      f'{c["nixl_count"]}',
                      f'vllm:nixl_num_failed_transfers_total{{engine="0",model_name="{self.model}"}} 0.0',
                      f'vllm:nixl_num_failed_notifications_total{{engine="0",model_name="{self.model}"}} 0.0']
        return "\n".join(["# TYPE vllm:prompt_tokens_by_source_total counter", *lines, ""])

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """Count what a vLLM server of this role would, and answer."""
        params = body.get("kv_transfer_params") or {}
        answer: dict[str, Any] = {}
        with self.lock:
            c = self.counters
            if self.role == "prefill" and params.get("do_remote_decode"):
                c["local_compute"] += PROMPT_TOKENS
                answer["kv_transfer_params"] = dict(PARAMS)
            elif self.role == "router" or (self.role == "decode" and params.get("remote_block_ids")):
                if self.transfer:
                    c["external_kv_transfer"] += PROMPT_TOKENS
                    c["kv_bytes"] += NIXL_BYTES
                    c["nixl_count"] += 1
                else:
                    c["local_compute"] += PROMPT_TOKENS
            else:
                c["local_compute"] += PROMPT_TOKENS
            c["success"] += 1
        prompts = body.get("prompt")
        prompts = prompts if isinstance(prompts, list) else [prompts]
        return {"id": "cmpl-1", "object": "text_completion", "model": self.model,
                "choices": [{"index": i, "text": " The answer is 7.", "finish_reason": "stop",
                             "logprobs": None} for i, _ in enumerate(prompts)], **answer}

def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def write_deployment(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class FakeEvaluate:
    """evaluate_endpoint's keyword shape: one real completion request per document to
    `base_url` (with `headers`), each answer judged by `correct(role, doc_id)`."""

    def __init__(self, correct: Callable[[str, int], bool] = lambda role, doc: True) -> None:
        self.correct = correct
        self.calls: list[dict[str, Any]] = []

    def __call__(self, *, role: str, base_url: str, served_model_name: str, task: str,
                 limit: int, sample_indices: list[int] | None, headers: Any = None,
                 **_: Any) -> EvalRun:
        self.calls.append({"role": role, "base_url": base_url, "limit": limit,
                           "docs": sample_indices, "headers": dict(headers or {})})
        docs = list(range(limit)) if sample_indices is None else list(sample_indices)
        questions = []
        for doc in docs:
            prompt = f"Question {doc}: what is 3 + 4?\nAnswer:"
            response = requests.post(f"{base_url}/v1/completions", headers=dict(headers or {}),
                                     json={"model": served_model_name, "prompt": prompt,
                                           "max_tokens": 8, "temperature": 0}, timeout=30)
            response.raise_for_status()
            text = response.json()["choices"][0]["text"]
            ok = self.correct(role, doc)
            questions.append(QuestionRecord(
                doc_id=doc, prompt_hash=prompt_hash(prompt), target="#### 7", generated=text,
                answer_strict="7" if ok else "8", answer_flexible="7" if ok else "8",
                correct=ok, correct_flexible=ok, finish_reason="stop"))
        n = len(questions)
        accuracy = sum(q.correct for q in questions) / n if n else 0.0
        return EvalRun(role=role, base_url=base_url, task=task, n=n, accuracy=accuracy,
                       accuracy_flexible=accuracy, wall_s=0.01, questions=tuple(questions))


def files_holding(root: Path, text: str) -> list[Path]:
    """Every file below `root` whose bytes contain `text`."""
    return [p for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]
