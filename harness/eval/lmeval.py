"""Endpoint → EvalRun: lm-eval's `local-completions` against one OpenAI endpoint, greedy, with
per-question records (doc id, prompt hash, generated text, extracted answer, correctness and the
generated tokens' top-k logprobs).

The baseline and the P/D proxy are evaluated with identical settings (task, few-shot seed,
question subset), so their records pair up by doc id and prompt hash. A request answered with
an error (an HTTP error status, or finish_reason "error") is never counted as a wrong answer:
the evaluation asks every question, then raises RequestsFailed.
"""
from __future__ import annotations

import contextvars
import copy
import json
import logging
import os
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from harness.core.prompts import prompt_hash

TASKS_DIR = Path(__file__).parent / "tasks"
DATA_DIR_TOKEN = "@DATA_DIR@"
GSM8K_ENV = "PD_ACCURACY_GSM8K_DIR"
log = logging.getLogger(__name__)


class DatasetNotFound(RuntimeError):
    pass


class RequestsFailed(RuntimeError):
    """Requests of an evaluation were answered with an error: an HTTP error status, or a
    completion whose finish_reason is "error" (vLLM's answer to a failed KV load). Raised once
    every question was asked; the message says on how many questions and with what."""

    def __init__(self, failures: "list[str] | tuple[str, ...]", questions: int) -> None:
        self.failures = tuple(failures)
        self.questions = questions
        counts = Counter(self.failures).most_common()
        kinds = ", ".join(f"{kind} x{count}" for kind, count in counts)
        super().__init__(f"requests failed on {len(self.failures)} of {questions} questions: "
                         f"{kinds}")


def default_gsm8k_dir() -> Path | None:
    """GSM8K jsonl: $PD_ACCURACY_GSM8K_DIR, else ../shared/data/gsm8k beside the checkout."""
    env = os.environ.get(GSM8K_ENV)
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]
    for cand in (repo.parent / "shared" / "data" / "gsm8k", repo / "shared" / "data" / "gsm8k"):
        if (cand / "test.jsonl").exists():
            return cand
    return None


def split_size(task: str, data_dir: str | os.PathLike[str] | None, split: str = "test") -> int | None:
    """Number of docs in a local task's split (None for hub datasets)."""
    if data_dir is None or not (Path(data_dir) / f"{split}.jsonl").exists():
        return None
    with open(Path(data_dir) / f"{split}.jsonl", "rb") as fh:
        return sum(1 for line in fh if line.strip())


def materialize_task(task: str, data_dir: str | os.PathLike[str] | None, out_dir: Path) -> Path:
    """Copy the packaged task YAML(s) into `out_dir`, filling in the data directory.

    Returns the include path to hand to lm-eval's TaskManager."""
    src = TASKS_DIR / f"{task}.yaml"
    if not src.exists():
        known = sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))
        raise DatasetNotFound(f"unknown task {task!r}; the harness ships: {', '.join(known)}")
    text = src.read_text()
    if DATA_DIR_TOKEN in text:
        if data_dir is None:
            raise DatasetNotFound(
                f"task {task} needs a local data directory (--dataset-dir or ${GSM8K_ENV})")
        data = Path(data_dir).resolve()
        for split in ("train", "test"):
            if not (data / f"{split}.jsonl").exists():
                raise DatasetNotFound(f"{data}/{split}.jsonl does not exist (task {task})")
        text = text.replace(DATA_DIR_TOKEN, str(data))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / src.name).write_text(text)
    for extra in TASKS_DIR.glob("*.py"):  # custom filters/utils referenced by task YAMLs
        (out_dir / extra.name).write_text(extra.read_text())
    return out_dir


@dataclass(frozen=True)
class QuestionRecord:
    doc_id: int
    prompt_hash: str
    target: str
    generated: str
    answer_strict: str
    answer_flexible: str
    correct: bool                    # strict-match exact match
    correct_flexible: bool
    finish_reason: str | None = None
    logprobs: dict | None = None     # OpenAI completions `logprobs` object of the generation
    # the failure the request answered with (HTTP status, finish_reason "error"), kept only by
    # an evaluation under weather (keep_failures); None: answered
    error: str | None = None
    # the answer's speculative decoding: vLLM's per-request acceptance (the response's
    # metrics.speculative_decoding: acceptance_histogram, num_draft_tokens, ...); None without
    # drafts or on a vLLM without --per-request-spec-decode-metrics
    spec: dict | None = None


@dataclass(frozen=True)
class EvalRun:
    role: str                        # "baseline" | "pd" | "baseline-aa" ...
    base_url: str
    task: str
    n: int
    accuracy: float
    accuracy_flexible: float
    wall_s: float
    questions: tuple[QuestionRecord, ...] = field(repr=False)
    # prompt hash -> the completions request lm-eval sent for it (a weather may send it again);
    # not written to the samples
    payloads: Mapping[str, dict] = field(default_factory=dict, repr=False, compare=False)

    def by_doc(self) -> dict[int, QuestionRecord]:
        return {q.doc_id: q for q in self.questions}

    def extended(self, more: "EvalRun") -> "EvalRun":
        """This run followed by `more` (the next stage's questions on the same endpoint)."""
        questions = self.questions + tuple(q for q in more.questions
                                           if q.doc_id not in self.by_doc())
        n = len(questions)
        return replace(self, n=n, questions=questions, wall_s=self.wall_s + more.wall_s,
                       payloads={**self.payloads, **more.payloads},
                       accuracy=sum(q.correct for q in questions) / n if n else 0.0,
                       accuracy_flexible=sum(q.correct_flexible for q in questions) / n if n else 0.0)

    def first(self, doc_ids: "set[int] | None" = None, n: int | None = None) -> "EvalRun":
        """The same run restricted to `doc_ids` (or its first `n` questions)."""
        kept = tuple(q for q in self.questions if doc_ids is None or q.doc_id in doc_ids)[:n]
        k = len(kept)
        return replace(self, n=k, questions=kept,
                       accuracy=sum(q.correct for q in kept) / k if k else 0.0,
                       accuracy_flexible=sum(q.correct_flexible for q in kept) / k if k else 0.0)

    def write_jsonl(self, path: Path) -> Path:
        from harness.core.atomic import atomic_write_text

        lines = [json.dumps(asdict(q), sort_keys=True) for q in self.questions]
        return atomic_write_text(path, "\n".join(lines) + ("\n" if lines else ""))


def _post_exactly(lm: Any, payload: dict) -> Any:
    """`payload` posted to `lm`'s (an lm-eval API model's) URL with exactly its own headers."""
    import requests

    from harness.core.exact_headers import ExactHeaders

    response = requests.post(lm.base_url, json=payload, headers=lm.header,
                             auth=ExactHeaders(lm.header), verify=lm.verify_certificate,
                             timeout=lm.timeout)
    response.raise_for_status()
    return response.json()


def _spec_of(out: Any) -> dict | None:
    """The response's per-request draft acceptance (vLLM reports it for one sequence only)."""
    metrics = out.get("metrics") if isinstance(out, dict) else None
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    return spec if isinstance(spec, dict) and len(out.get("choices") or ()) == 1 else None


def _choices_by_prompt(outputs: Any, prompts: list[str] | None) -> dict[str, dict]:
    """Each answered choice's text, finish_reason, logprobs and draft acceptance, keyed by its
    prompt's hash."""
    captured: dict[str, dict] = {}
    for out in (outputs if isinstance(outputs, list) else [outputs]) if prompts else []:
        for choice in out.get("choices", []):
            idx = choice.get("index", 0)
            if idx < len(prompts) and isinstance(prompts[idx], str):
                captured[prompt_hash(prompts[idx])] = {
                    "text": choice.get("text"), "finish_reason": choice.get("finish_reason"),
                    "logprobs": choice.get("logprobs"), "spec": _spec_of(out)}
    return captured


def _capturing_lm_class():
    """An lm-eval local-completions model that also keeps each generation's raw choice
    (text, finish_reason, logprobs), keyed by the prompt's hash, and each error answer
    (``request_failures``, one entry per question) instead of stopping at the first one."""
    import aiohttp
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    current_prompts: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
        "pd_accuracy_prompts", default=None)

    class CapturingCompletions(LocalCompletionsAPI):
        top_logprobs: int = 0
        request_headers: dict[str, str] = {}

        @property
        def api_key(self) -> str:
            # lm-eval's default reads $OPENAI_API_KEY: a token for another host
            return ""

        @property
        def header(self) -> dict:
            # exactly the headers the harness chose (none without an auth_env); lm-eval's own
            # falls back to "Bearer $OPENAI_API_KEY" whenever they are empty
            return dict(self.request_headers)

        def model_call(self, messages, *, generate=True, gen_kwargs=None, **kwargs):
            # lm-eval's own (the concurrency-1 path) lets requests add ~/.netrc's credentials
            payload = self._create_payload(self.create_message(messages), generate=generate,
                                           gen_kwargs=copy.deepcopy(gen_kwargs), seed=self._seed,
                                           eos=self.eos_string, **kwargs)
            return _post_exactly(self, payload)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.captured: dict[str, dict] = {}
            self.request_failures: list[str] = []
            self.failed_prompts: dict[str, str] = {}   # prompt hash -> its failure
            self.payloads: dict[str, dict] = {}        # prompt hash -> its request

        async def amodel_call(self, session, sem, messages, *, generate=True, **kwargs):
            # lm-eval ends the evaluation at the first HTTP error while the other requests still
            # run on the servers (a shared P/D pair's next cell would count their transfers as
            # its own): keep the error, answer the request's questions with "", and let
            # evaluate_endpoint raise RequestsFailed once every question was asked
            try:
                return await super().amodel_call(session, sem, messages, generate=generate,
                                                  **kwargs)
            except aiohttp.ClientResponseError as exc:
                if not generate:
                    raise
                prompts = list(messages) if isinstance(messages, (list, tuple)) else [messages]
                self.request_failures += [f"HTTP {exc.status} {exc.message}"] * len(prompts)
                self.failed_prompts.update({prompt_hash(p): f"HTTP {exc.status} {exc.message}"
                                            for p in prompts if isinstance(p, str)})
                return [""] * len(prompts)

        def _create_payload(self, messages, generate=False, gen_kwargs=None, seed=1234,
                            eos=None, **kwargs):
            payload = super()._create_payload(messages, generate=generate, gen_kwargs=gen_kwargs,
                                              seed=seed, eos=eos, **kwargs)
            if generate:
                if self.top_logprobs:
                    payload["logprobs"] = self.top_logprobs
                # this task parses the answer next: keep its prompts (a list, or zip's tuple)
                prompts = list(messages) if isinstance(messages, (list, tuple)) else [messages]
                current_prompts.set(prompts)
                self.payloads.update({prompt_hash(p): {**payload, "prompt": p} for p in prompts
                                      if isinstance(p, str)})
            return payload

        def parse_generations(self, outputs, **kwargs):  # type: ignore[override]
            texts = LocalCompletionsAPI.parse_generations(outputs, **kwargs)
            for out in outputs if isinstance(outputs, list) else [outputs]:
                self.request_failures += ['finish_reason "error"'
                                          for choice in out.get("choices", [])
                                          if choice.get("finish_reason") == "error"]
            self.captured.update(_choices_by_prompt(outputs, current_prompts.get()))
            return texts

    return CapturingCompletions


def evaluate_endpoint(
    *,
    role: str,
    base_url: str,
    served_model_name: str,
    task: str,
    data_dir: str | os.PathLike[str] | None,
    limit: int,
    num_fewshot: int | None = None,
    seed: int = 1234,
    concurrency: int = 4,
    top_logprobs: int = 5,
    max_gen_toks: int | None = None,
    timeout_s: float = 300.0,
    work_dir: Path | None = None,
    sample_indices: list[int] | None = None,
    headers: Mapping[str, str] | None = None,
    keep_failures: bool = False,
) -> EvalRun:
    """Run lm-eval against `base_url` (an OpenAI server or the P/D proxy) and return the EvalRun.
    `headers` (e.g. an external deployment's Authorization) go with every request, and nothing
    else does: no Authorization without them, whatever $OPENAI_API_KEY holds. They are never
    logged or kept in the EvalRun. `keep_failures` (under weather): a failed request does not
    raise; its question carries the failure (QuestionRecord.error) and counts as not correct."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pd-accuracy-task-", dir=work_dir) as tmp:
        if (TASKS_DIR / f"{task}.yaml").exists():
            include = materialize_task(task, data_dir, Path(tmp))
            task_manager = TaskManager(include_path=str(include), include_defaults=False)
        else:   # lm-eval's own task (e.g. gsm8k, its dataset from the hub)
            task_manager = TaskManager(include_defaults=True)
        lm_cls = _capturing_lm_class()
        lm = lm_cls(
            model=served_model_name,
            base_url=f"{base_url.rstrip('/')}/v1/completions",
            tokenizer_backend=None,
            tokenized_requests=False,
            num_concurrent=concurrency,
            max_retries=1,
            timeout=int(timeout_s),
            seed=seed,
            **({"max_gen_toks": max_gen_toks} if max_gen_toks else {}),
        )
        lm.top_logprobs = top_logprobs
        lm.request_headers = dict(headers or {})
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=[task],
            num_fewshot=num_fewshot,
            limit=None if sample_indices else limit,
            samples={task: list(sample_indices)} if sample_indices else None,
            task_manager=task_manager,
            log_samples=True,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
            bootstrap_iters=0,
            verbosity="WARNING",
        )
    if results is None:
        raise RuntimeError(f"lm-eval returned no results for {role} at {base_url}")
    samples = results["samples"][task]
    questions = _questions_from_samples(samples, lm.captured)
    n = len(questions)
    if keep_failures:
        questions = [_with_failure(q, lm.failed_prompts) for q in questions]
    elif lm.request_failures:
        raise RequestsFailed(lm.request_failures, n)
    acc = sum(q.correct for q in questions) / n if n else 0.0
    acc_flex = sum(q.correct_flexible for q in questions) / n if n else 0.0
    return EvalRun(role=role, base_url=base_url, task=task, n=n, accuracy=acc,
                   accuracy_flexible=acc_flex, wall_s=time.monotonic() - started,
                   questions=tuple(questions),
                   payloads={q.prompt_hash: lm.payloads[q.prompt_hash] for q in questions
                             if q.prompt_hash in lm.payloads})


def _with_failure(q: QuestionRecord, failed_prompts: Mapping[str, str]) -> QuestionRecord:
    """`q` with the failure its request answered with, if any (an error answer is not correct)."""
    error = failed_prompts.get(q.prompt_hash)
    if error is None and q.finish_reason == "error":
        error = 'finish_reason "error"'
    if error is None:
        return q
    return replace(q, error=error, correct=False, correct_flexible=False)


def _questions_from_samples(samples: list[dict], captured: dict[str, dict]) -> list[QuestionRecord]:
    by_doc: dict[int, dict[str, dict]] = {}
    for s in samples:
        by_doc.setdefault(int(s["doc_id"]), {})[s.get("filter", "none")] = s
    out = []
    for doc_id in sorted(by_doc):
        filters = by_doc[doc_id]
        strict = filters.get("strict-match") or next(iter(filters.values()))
        flexible = filters.get("flexible-extract", strict)
        prompt = strict["arguments"][0][0]
        generated = strict["resps"][0][0] if strict["resps"] and strict["resps"][0] else ""
        ph = prompt_hash(prompt)
        cap = captured.get(ph, {})
        out.append(QuestionRecord(
            doc_id=doc_id,
            prompt_hash=ph,
            target=str(strict["target"]),
            generated=generated,
            answer_strict=str(strict["filtered_resps"][0]),
            answer_flexible=str(flexible["filtered_resps"][0]),
            correct=bool(strict.get("exact_match", 0.0) >= 1.0),
            correct_flexible=bool(flexible.get("exact_match", 0.0) >= 1.0),
            finish_reason=cap.get("finish_reason"),
            logprobs=cap.get("logprobs"),
            spec=cap.get("spec"),
        ))
    return out
