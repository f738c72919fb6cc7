"""The command steps of generated Buildkite pipeline documents, with Buildkite's semantics resolved.

`farm_steps` reads the documents `harness.ci.pipeline.generate_pipeline` returns into `FarmStep`s
for the local farm (harness.ci.farm): ``depends_on`` of a step and of its group,
``allow_dependency_failure``, ``parallelism``, ``retry.automatic`` (`RetryRule`), ``soft_fail``
and ``timeout_in_minutes`` become plain fields; the GPUs a step needs come from
``PD_ACCURACY_GPUS`` in its env, else from its agent queue.

`interpolate` does to a command or env value what ``buildkite-agent pipeline upload`` does
(``$$`` becomes a literal ``$``; ``$VAR``/``${VAR}``/``${VAR:-default}`` are filled from the
environment); the farm applies it when it runs a step.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from harness.ci.pipeline import DEFAULT_QUEUES, normalize_queues

DEFAULT_AUTOMATIC_RETRY_LIMIT = 2   # Buildkite's limit for `automatic: true`

_INTERPOLATION = re.compile(r"\$\$|\$\{(\w+)(?::?-([^}]*))?\}|\$(\w+)")


def interpolate(text: str, env: Mapping[str, str] | None = None) -> str:
    """`text` as ``buildkite-agent pipeline upload`` leaves it: ``$$`` -> ``$``, variables
    filled from `env` (default: this process's environment)."""
    env = os.environ if env is None else env

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(3)
        value = env.get(name, "")
        if not value and match.group(2) is not None:
            return match.group(2)
        return value

    return _INTERPOLATION.sub(sub, text)


@dataclass(frozen=True)
class RetryRule:
    exit_statuses: frozenset[int] | None   # None: any exit status ("*")
    limit: int

    def matches(self, status: int) -> bool:
        return self.exit_statuses is None or status in self.exit_statuses


@dataclass(frozen=True)
class FarmStep:
    """One command step of a pipeline, as the farm runs it."""

    key: str
    label: str
    commands: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    gpus: int = 0
    parallelism: int = 1
    depends_on: tuple[str, ...] = ()
    allow_dependency_failure: bool = False
    retry: tuple[RetryRule, ...] = ()
    soft_fail: frozenset[int] | bool = False  # True: any nonzero status
    timeout_s: float | None = None
    group_key: str | None = None

    def retry_limit(self, status: int) -> int:
        for rule in self.retry:
            if rule.matches(status):
                return rule.limit
        return 0

    def is_soft(self, status: int) -> bool:
        if self.soft_fail is True:
            return status != 0
        if not self.soft_fail:
            return False
        return "*" in self.soft_fail or status in self.soft_fail  # type: ignore[operator]


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _retry_rules(retry: Any) -> tuple[RetryRule, ...]:
    automatic = (retry or {}).get("automatic") if isinstance(retry, Mapping) else None
    if automatic in (None, False, "false"):
        return ()
    if automatic in (True, "true"):
        return (RetryRule(None, DEFAULT_AUTOMATIC_RETRY_LIMIT),)
    rules = []
    for rule in _as_list(automatic):
        status = rule.get("exit_status", "*")
        statuses = None if status == "*" else frozenset(int(s) for s in _as_list(status))
        rules.append(RetryRule(statuses, int(rule.get("limit", DEFAULT_AUTOMATIC_RETRY_LIMIT))))
    return tuple(rules)


def _soft_fail(value: Any) -> frozenset | bool:
    if value in (None, False, "false"):
        return False
    if value in (True, "true"):
        return True
    statuses = set()
    for entry in _as_list(value):
        status = entry.get("exit_status", "*") if isinstance(entry, Mapping) else entry
        statuses.add("*" if status == "*" else int(status))
    return frozenset(statuses)


def _deps(value: Any) -> tuple[str, ...]:
    return tuple(d if isinstance(d, str) else d["step"] for d in _as_list(value)
                 if isinstance(d, str) or (isinstance(d, Mapping) and d.get("step")))


def _gpus_of(step: Mapping[str, Any], queues: Mapping[int, str]) -> int:
    env = step.get("env") or {}
    if "PD_ACCURACY_GPUS" in env:
        return int(env["PD_ACCURACY_GPUS"])
    queue = (step.get("agents") or {}).get("queue") if isinstance(step.get("agents"), Mapping) else None
    by_name = {name: gpus for gpus, name in normalize_queues(queues).items()}
    return by_name.get(queue, 0)


def farm_steps(docs: Iterable[Mapping[str, Any]],
               queues: Mapping[int, str] | None = None) -> list[FarmStep]:
    """The command steps of pipeline `docs`, in upload order, with Buildkite semantics resolved.

    Wait, block, input and trigger steps are not supported (the generator never emits them).
    """
    queues = queues or DEFAULT_QUEUES
    out: list[FarmStep] = []

    def add(step: Mapping[str, Any], group: Mapping[str, Any] | None) -> None:
        if not isinstance(step, Mapping) or not ("command" in step or "commands" in step):
            raise ValueError(f"farm runs command steps only, got {step!r}")
        commands = tuple(str(c) for c in _as_list(step.get("commands", step.get("command"))))
        key = step.get("key") or f"step-{len(out) + 1}"
        depends = _deps(step.get("depends_on"))
        allow = step.get("allow_dependency_failure") in (True, "true")
        if group is not None:
            depends = _deps(group.get("depends_on")) + depends
            allow = allow or group.get("allow_dependency_failure") in (True, "true")
        timeout = step.get("timeout_in_minutes")
        out.append(FarmStep(
            key=key,
            label=str(step.get("label") or key),
            commands=commands,
            env={str(k): str(v) for k, v in (step.get("env") or {}).items()},
            gpus=_gpus_of(step, queues),
            parallelism=int(step.get("parallelism") or 1),
            depends_on=depends,
            allow_dependency_failure=allow,
            retry=_retry_rules(step.get("retry")),
            soft_fail=_soft_fail(step.get("soft_fail")),
            timeout_s=float(timeout) * 60 if timeout else None,
            group_key=group.get("key") if group is not None else None,
        ))

    for doc in docs:
        for step in doc.get("steps", []):
            if isinstance(step, Mapping) and "group" in step:
                for child in step.get("steps", []):
                    add(child, step)
            else:
                add(step, None)
    known = {s.key for s in out} | {s.group_key for s in out if s.group_key}
    for step in out:
        unknown = [d for d in step.depends_on if d not in known]
        if unknown:
            raise ValueError(f"step {step.key!r} depends on unknown steps: {unknown}")
    return out


__all__ = ["DEFAULT_AUTOMATIC_RETRY_LIMIT", "FarmStep", "RetryRule", "farm_steps", "interpolate"]
