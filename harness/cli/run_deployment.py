"""The checks of `pd-accuracy run --deployment FILE` before any question is sent: no flag that
picks or builds cells, a file that loads, endpoints that answer as the verdict needs and a task
whose documents are here. Every problem is one line (UsageError; exit 2); the judging itself is
harness.run.external."""
from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from harness.cli.vocabulary import CANARY_GROUP, CELL_GROUP, SELECTION_GROUP
from harness.core.options import RunOptions, UsageError
from harness.run.deployment_file import (DeploymentError, ExternalDeployment, check_endpoints,
                                         checks_not_available, load_deployment)
from harness.run.external import ModelFacts, cell_id_for, model_facts, task_problem

# the argument groups that pick or build cells (every flag in them, present and future), and the
# options of how the harness starts servers: the file describes both
CELL_GROUPS = (SELECTION_GROUP, CELL_GROUP, CANARY_GROUP)
SERVER_FLAGS = ("task", "platform", "gpu_layout", "kv_cache_bytes", "max_starting",
                "startup_timeout", "server_start", "parallel_groups", "vllm")


class PreflightProblems(UsageError):
    """Several one-line problems (`lines`), all reported, exit 2."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = list(lines)


def refuse_cell_flags(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """UsageError naming every flag given (a value other than its default) with --deployment."""
    # argparse keeps no public list of a parser's groups and options
    refused = [a for g in parser._action_groups if g.title in CELL_GROUPS
               for a in g._group_actions if a.dest != "deployment"]
    refused += [a for a in parser._actions if a.dest in SERVER_FLAGS]
    from harness.cli.inputs import given as was_given

    given = [max(a.option_strings, key=len) for a in refused if was_given(args, a.dest)]
    if given:
        raise UsageError(f"--deployment judges the deployment its file describes; it does not "
                         f"combine with {', '.join(given)} (the file names the model, task and "
                         f"servers)")


def preflight(path: str, options: RunOptions, environ: Mapping[str, str] = os.environ,
              allowed_auth_envs: tuple[str, ...] = ()) -> tuple[ExternalDeployment, ModelFacts]:
    """The loaded deployment and its model facts, once every endpoint answered as needed.
    `allowed_auth_envs`: --allow-auth-env, the variables beyond PD_* the file may name."""
    try:
        dep = load_deployment(path, allowed_auth_envs)
    except DeploymentError as exc:
        raise UsageError(str(exc)) from None
    problems = check_endpoints(dep, environ=environ)
    if problems:
        raise PreflightProblems([f"{dep.source}: {p}" for p in problems])
    facts = model_facts(dep, options.dataset_dir)
    problem = task_problem(facts)
    if problem:
        raise UsageError(f"{dep.source}: task {facts.task}: {problem}")
    return dep, facts


def describe(dep: ExternalDeployment, facts: ModelFacts) -> None:
    """--dry-run: what would be judged, and what could not be checked."""
    pd = dep.router.url if dep.router else (
        f"harness proxy over prefill {[e.url for e in dep.prefill]}, decode "
        f"{[e.url for e in dep.decode]}")
    print(f"# {cell_id_for(dep.name)}: {dep.model} on {facts.task}"
          f"{' (hybrid)' if facts.hybrid else ''}; every endpoint answered")
    print(f"baseline: {dep.baseline.url}")
    print(f"P/D: {pd}")
    print(f"decode metrics: {[e.url for e in dep.decode_metrics]}")
    for line in checks_not_available(dep):
        print(f"not checked: {line}")


__all__ = ["CELL_GROUPS", "SERVER_FLAGS", "PreflightProblems", "describe", "preflight", "refuse_cell_flags"]
