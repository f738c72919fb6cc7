"""Validation of Buildkite pipeline documents before they are uploaded.

Each document must pass the vendored Buildkite pipeline JSON schema
(``harness/ci/schemas/buildkite-pipeline-schema.json``) and the rules an upload is held to that
the schema does not state: at most `MAX_STEPS_PER_UPLOAD` steps (groups and the steps inside them
count), unique step keys, ``$`` escaped as ``$$`` in commands; across the uploads of one build,
keys stay unique and ``depends_on`` names a step of the same or an earlier upload.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any, Iterable, Mapping, Sequence

MAX_STEPS_PER_UPLOAD = 500
SCHEMA_RESOURCE = "buildkite-pipeline-schema.json"

_KEY_PATTERN = re.compile(r"^[a-zA-Z0-9_\-:${}.,]+$")
_UUID_PATTERN = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


class PipelineValidationError(ValueError):
    """A generated pipeline document breaks the Buildkite schema or one of our own rules."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        shown = "\n  ".join(self.problems[:20])
        more = f"\n  ... and {len(self.problems) - 20} more" if len(self.problems) > 20 else ""
        super().__init__(f"invalid Buildkite pipeline:\n  {shown}{more}")


@lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    text = resources.files("harness.ci").joinpath("schemas", SCHEMA_RESOURCE).read_text("utf-8")
    return json.loads(text)


@lru_cache(maxsize=1)
def _validator():
    from jsonschema import Draft7Validator

    return Draft7Validator(_schema())


def iter_steps(doc_or_steps: Mapping[str, Any] | Sequence[Any]) -> Iterable[Any]:
    """Every step of a document, groups first then the steps inside them."""
    steps = doc_or_steps.get("steps", []) if isinstance(doc_or_steps, Mapping) else doc_or_steps
    for step in steps or []:
        yield step
        if isinstance(step, Mapping) and "group" in step:
            yield from iter_steps(step.get("steps") or [])


def count_steps(doc: Mapping[str, Any]) -> int:
    """Steps Buildkite counts against the per-upload limit (groups and their children)."""
    return sum(1 for _ in iter_steps(doc))


def _commands_of(step: Mapping[str, Any]) -> list[str]:
    for field in ("commands", "command"):
        value = step.get(field)
        if isinstance(value, str):
            return [value]
        if isinstance(value, list):
            return [v for v in value if isinstance(v, str)]
    return []


def _dependencies(step: Mapping[str, Any]) -> list[str]:
    deps = step.get("depends_on")
    if deps is None:
        return []
    if isinstance(deps, str):
        return [deps]
    return [d if isinstance(d, str) else d.get("step") for d in deps
            if isinstance(d, (str, Mapping))]


def validate_pipeline(doc: Mapping[str, Any], *, max_steps: int = MAX_STEPS_PER_UPLOAD) -> None:
    """Raise PipelineValidationError unless `doc` is one valid Buildkite upload.

    Checks the Buildkite JSON schema, the per-upload step limit, unique keys, and that every
    command escapes ``$`` as ``$$`` (an unescaped ``$`` would be interpolated by
    ``buildkite-agent pipeline upload`` instead of by the job's shell).
    """
    problems = []
    for error in sorted(_validator().iter_errors(doc), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in error.absolute_path) or "<root>"
        problems.append(f"schema: {where}: {error.message[:300]}")
    if not problems:
        steps = [s for s in iter_steps(doc) if isinstance(s, Mapping)]
        if count_steps(doc) > max_steps:
            problems.append(f"{count_steps(doc)} steps in one upload (limit {max_steps})")
        keys = [s["key"] for s in steps if "key" in s]
        for dup in sorted({k for k in keys if keys.count(k) > 1}):
            problems.append(f"duplicate step key {dup!r}")
        for step in steps:
            for command in _commands_of(step):
                if "$" in command.replace("$$", ""):
                    problems.append(f"step {step.get('key')!r}: unescaped '$' in {command!r}")
    if problems:
        raise PipelineValidationError(problems)


def validate_uploads(docs: Sequence[Mapping[str, Any]], *,
                     max_steps: int = MAX_STEPS_PER_UPLOAD) -> None:
    """Validate each upload, plus keys unique across uploads and depends_on resolvable
    (a step may depend on steps of its own or an earlier upload)."""
    problems = []
    seen: set[str] = set()
    for index, doc in enumerate(docs, start=1):
        try:
            validate_pipeline(doc, max_steps=max_steps)
        except PipelineValidationError as exc:
            problems += [f"upload {index}: {p}" for p in exc.problems]
            continue
        steps = [s for s in iter_steps(doc) if isinstance(s, Mapping)]
        keys = {s["key"] for s in steps if "key" in s}
        for key in sorted(keys & seen):
            problems.append(f"upload {index}: key {key!r} already used by an earlier upload")
        seen |= keys
        for step in steps:
            for dep in _dependencies(step):
                if dep not in seen:
                    problems.append(f"upload {index}: step {step.get('key')!r} depends on "
                                    f"unknown step {dep!r}")
    if problems:
        raise PipelineValidationError(problems)


def is_valid_key(key: str) -> bool:
    """Whether `key` is accepted by Buildkite as a step key."""
    return bool(len(key) <= 100 and _KEY_PATTERN.match(key) and not _UUID_PATTERN.match(key))


__all__ = ["MAX_STEPS_PER_UPLOAD", "PipelineValidationError", "count_steps", "is_valid_key",
           "iter_steps", "validate_pipeline", "validate_uploads"]
