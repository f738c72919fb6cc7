"""A P/D deployment the harness judges but did not start, described by a YAML file.

The file names the baseline endpoint, the P/D endpoint (the user's own router, or
``router: harness-proxy`` with the user's prefill and decode servers, so the harness's proxy sits
in front), the decode (and optionally prefill) /metrics URLs, the served model name and the task.
docs/deployment.md documents the format; harness/run/deployment.schema.json states it.

`load_deployment` turns the file into an `ExternalDeployment` or raises `DeploymentError` with one
line naming the file and the place in it. `check_endpoints` asks every endpoint before any
question is sent and returns one line per problem. `checks_not_available` names the verdict
checks a user router cannot support, `to_record` gives what a record keeps.

Secrets never enter the file, the dataclass or a record: the file names an environment variable
(``auth_env: PD_TOKEN``) whose value is read only when a request is made, and sent as
``Authorization: Bearer $PD_TOKEN`` to that endpoint only. A file may name only variables of
the harness's own pattern (``PD_*``, not ``PD_ACCURACY_*``: `AUTH_ENV_PATTERN`), or one the user
allowed on the command line (``--allow-auth-env NAME``): a file from a pull request must not be
able to send ``AWS_SECRET_ACCESS_KEY`` to a URL of its choosing. A token in a URL is refused.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import requests
from jsonschema import Draft202012Validator
from jsonschema.exceptions import relevance
from prometheus_client.parser import text_string_to_metric_families

from harness.connectors import (DEFAULT_KV_CONNECTOR, connector_for, connector_row,
                                driven_connectors)
from harness.core import exact_headers
from harness.core.bounded_yaml import BoundedYAMLError, load_bounded
from harness.core.redact import register_secret
from harness.core.url_tokens import url_token_problem
from harness.eval.lmeval import TASKS_DIR
from harness.matrix.schema import describe

SCHEMA: dict[str, Any] = json.loads(
    resources.files("harness.run").joinpath("deployment.schema.json").read_text("utf-8"))
_VALIDATOR = Draft202012Validator(SCHEMA)

HARNESS_PROXY = "harness-proxy"
# the variables a deployment file may name on its own; any other needs --allow-auth-env NAME
AUTH_ENV_PATTERN = re.compile(r"PD_(?!ACCURACY_)[A-Z0-9_]+")
AUTO_TASK = "auto"
DEFAULT_TIMEOUT_S = 10.0

# Samples every vLLM server exposes from its start; a decode page adds its connector's byte and
# failed-transfer counters where the connector puts them on the decode (per engine, at 0): the
# transfer proof reads them (harness.eval.metrics), so a page without them cannot prove anything.
SERVER_SAMPLES = ("vllm:prompt_tokens_by_source_total",)
PROVING_COUNTERS = ("kv_bytes", "failed_transfers")


def samples_wanted(kv_connector: str, role: str) -> tuple[str, ...]:
    """What a `role` server's /metrics page must hold for the transfer proof of `kv_connector`."""
    mapped = connector_for(kv_connector).metrics.counters_from(role)
    return SERVER_SAMPLES + tuple(s for s, c in mapped.items() if c in PROVING_COUNTERS)

# The transfer checks (harness.judge.verdict.transfer_checks) that read the harness proxy's
# per-request records; a user's router keeps no such records.
PROXY_ONLY_CHECKS: dict[str, str] = {
    "proxy-saw-every-question": "counts the requests in the harness proxy's records",
    "prefill-returned-params": "reads each prefill answer's kv_transfer_params from the harness "
                               "proxy's records",
    "decode-got-params": "reads the kv_transfer_params each decode request received from the "
                         "harness proxy's records",
    "decode-got-own-params": "compares, per request, the params decode received with those its "
                             "own prefill returned, from the harness proxy's records",
}

Get = Callable[..., Any]   # requests.get's shape: get(url, headers=..., timeout=...) -> Response


class DeploymentError(ValueError):
    """The deployment file is malformed, or names an unset environment variable. One line."""


@dataclass(frozen=True)
class Endpoint:
    """One URL the harness calls, and the environment variable holding its bearer token."""
    url: str
    auth_env: str | None = None

    def headers(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The request headers; DeploymentError when `auth_env` names an unset variable."""
        if self.auth_env is None:
            return {}
        token = environ.get(self.auth_env)
        if not token:
            raise DeploymentError(f"auth_env names {self.auth_env}, which is not set in this "
                                  f"environment")
        register_secret(token)   # redacted from everything written from now on
        return {"Authorization": f"Bearer {token}"}

    def to_dict(self) -> dict[str, str | None]:
        return {"url": self.url, "auth_env": self.auth_env}


@dataclass(frozen=True)
class ExternalDeployment:
    source: str                        # the file it was read from
    name: str
    model: str                         # the served model name both endpoints list
    task: str                          # an lm-eval task of harness/eval/tasks, or "auto"
    baseline: Endpoint
    router: Endpoint | None            # the user's P/D router; None: the harness proxy
    prefill: tuple[Endpoint, ...]      # the harness proxy's prefill servers (empty with a router)
    decode: tuple[Endpoint, ...]       # the harness proxy's decode servers (empty with a router)
    decode_metrics: tuple[Endpoint, ...]
    prefill_metrics: tuple[Endpoint, ...]
    timeout_s: float = DEFAULT_TIMEOUT_S
    kv_connector: str = DEFAULT_KV_CONNECTOR   # harness.connectors: how its KV moves

    @property
    def uses_harness_proxy(self) -> bool:
        return self.router is None

    @property
    def pd_endpoint(self) -> Endpoint:
        """What the P/D questions go to: the user's router, or (its auth_env) the harness proxy in
        front of the first decode server, which forwards the Authorization header."""
        return self.router if self.router is not None else self.decode[0]


def known_tasks() -> list[str]:
    return sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))


def load_deployment(path: str | os.PathLike[str],
                    allowed_auth_envs: "tuple[str, ...] | list[str]" = ()) -> ExternalDeployment:
    """Read (harness.core.bounded_yaml), validate and build; DeploymentError (one line naming the
    file) on any problem. `allowed_auth_envs`: names the user allowed beyond AUTH_ENV_PATTERN."""
    source = str(path)
    try:
        data = load_bounded(path)
    except BoundedYAMLError as exc:
        raise DeploymentError(f"{source}: {exc}") from None
    error = max(_VALIDATOR.iter_errors(data), key=relevance, default=None)
    if error is not None:
        raise DeploymentError(describe(error, source))
    task = data.get("task", AUTO_TASK)
    if task != AUTO_TASK and task not in known_tasks():
        raise DeploymentError(f"{source}: task: unknown task {task!r}; the harness ships "
                              f"{', '.join(known_tasks())}, or {AUTO_TASK} (chosen by model)")
    connector = data.get("kv_connector", DEFAULT_KV_CONNECTOR)
    if connector not in driven_connectors():
        raise DeploymentError(f"{source}: kv_connector: unknown KV connector {connector!r}; use "
                              f"one of {', '.join(driven_connectors())}")
    dep = _build(data, source, task)
    problem = trust_problem(dep, allowed_auth_envs)
    if problem:
        raise DeploymentError(f"{source}: {problem}")
    return dep


def all_endpoints(dep: ExternalDeployment) -> list[tuple[str, Endpoint]]:
    """(where in the file, endpoint) for every URL the harness will call."""
    named = [("baseline", dep.baseline)] + ([("pd.router", dep.router)] if dep.router else [])
    named += [(f"pd.prefill[{i}]", e) for i, e in enumerate(dep.prefill)]
    named += [(f"pd.decode[{i}]", e) for i, e in enumerate(dep.decode)]
    named += [(f"metrics.decode[{i}]", e) for i, e in enumerate(dep.decode_metrics)]
    named += [(f"metrics.prefill[{i}]", e) for i, e in enumerate(dep.prefill_metrics)]
    return named


def trust_problem(dep: ExternalDeployment, allowed_auth_envs: "tuple[str, ...] | list[str]" = ()
                  ) -> str | None:
    """One line when a URL carries a token or an auth_env names a variable the file may not
    send (neither AUTH_ENV_PATTERN nor allowed on the command line)."""
    if not (0 < dep.timeout_s < 3600):   # NaN and .inf fail this too
        return f"timeout_s: must be a number of seconds in (0, 3600), got {dep.timeout_s!r}"
    for where, endpoint in all_endpoints(dep):
        problem = url_token_problem(endpoint.url, f"{where}: URL")
        if problem:
            return problem
        name = endpoint.auth_env
        if name and name not in allowed_auth_envs and not AUTH_ENV_PATTERN.fullmatch(name):
            return (f"{where}: auth_env {name} is not a PD_* variable; a deployment file may "
                    f"send only those as a token, or one allowed with --allow-auth-env {name}")
    return None


def _build(data: dict[str, Any], source: str, task: str) -> ExternalDeployment:
    def endpoints(urls: list[str], auth_env: str | None) -> tuple[Endpoint, ...]:
        return tuple(Endpoint(url.rstrip("/"), auth_env) for url in urls)

    pd = data["pd"]
    pd_auth = pd.get("auth_env")
    baseline = Endpoint(data["baseline"]["url"].rstrip("/"), data["baseline"].get("auth_env"))
    if pd["router"] == HARNESS_PROXY:
        router = None
        prefill, decode = endpoints(pd["prefill"], pd_auth), endpoints(pd["decode"], pd_auth)
    else:
        router = Endpoint(pd["router"].rstrip("/"), pd_auth)
        prefill, decode = (), ()
        if router.url == baseline.url:
            raise DeploymentError(f"{source}: pd.router: is the baseline's URL too: the "
                                  f"comparison needs a server without disaggregation")
    # without a metrics section (allowed with the harness proxy only): vLLM serves /metrics
    # beside /v1 on each server's port; a given section is the whole list
    metrics = data.get("metrics") or {
        "decode": [f"{e.url}/metrics" for e in decode],
        "prefill": [f"{e.url}/metrics" for e in prefill]}
    metrics_auth = metrics.get("auth_env")
    return ExternalDeployment(
        source=source, name=data.get("name") or Path(source).stem, model=data["model"], task=task,
        baseline=baseline, router=router, prefill=prefill, decode=decode,
        decode_metrics=endpoints(metrics["decode"], metrics_auth),
        prefill_metrics=endpoints(metrics.get("prefill", []), metrics_auth),
        timeout_s=float(data.get("timeout_s", DEFAULT_TIMEOUT_S)),
        kv_connector=data.get("kv_connector", DEFAULT_KV_CONNECTOR))


# ---- before the first question -------------------------------------------------------------
def check_endpoints(dep: ExternalDeployment, get: Get = exact_headers.get,
                    environ: Mapping[str, str] = os.environ) -> list[str]:
    """Ask every endpoint once: each OpenAI endpoint lists `dep.model` in /v1/models, each
    /metrics page parses as Prometheus text and holds the samples the verdict reads. Returns one
    line per problem (empty: all answered as needed); no line holds a token."""
    problems: list[str] = []
    models_to_ask = [("baseline", dep.baseline)]
    if dep.router is not None:
        models_to_ask.append(("P/D endpoint", dep.router))
    models_to_ask += [("prefill server", e) for e in dep.prefill]
    models_to_ask += [("decode server", e) for e in dep.decode]
    for label, endpoint in models_to_ask:
        problem = _check_models(label, endpoint, dep.model, dep.timeout_s, get, environ)
        if problem:
            problems.append(problem)
    label = connector_row(dep.kv_connector).word
    pages = [("decode", e, samples_wanted(dep.kv_connector, "decode"),
              f"a vLLM decode server with {label}") for e in dep.decode_metrics]
    pages += [("prefill", e, samples_wanted(dep.kv_connector, "prefill"),
               f"a vLLM prefill server with {label}"
               if samples_wanted(dep.kv_connector, "prefill") != SERVER_SAMPLES
               else "a vLLM server") for e in dep.prefill_metrics]
    for role, endpoint, wanted, what in pages:
        problem = _check_metrics(role, endpoint, wanted, what, dep.timeout_s, get, environ)
        if problem:
            problems.append(problem)
    return problems


def _fetch(label: str, endpoint: Endpoint, url: str, timeout_s: float, get: Get,
           environ: Mapping[str, str]) -> tuple[Any, str | None]:
    """(response, None) for a 200 answer, else (None, the one-line problem)."""
    try:
        response = get(url, headers=endpoint.headers(environ), timeout=timeout_s)
    except DeploymentError as exc:
        return None, f"{label} at {endpoint.url}: {exc}"
    except requests.Timeout:
        return None, f"{label} at {url}: no answer within {timeout_s:g} s"
    except requests.RequestException as exc:
        return None, f"{label} at {url}: unreachable: {_connection_problem(exc)}"
    except ValueError as exc:   # exact_headers refuses a token in the URL
        return None, f"{label}: {exc}"
    status = response.status_code
    if status != 200:
        hint = ": is auth_env naming the right variable?" if status in (401, 403) else ""
        return None, f"{label} at {url}: answered HTTP {status}{hint}"
    return response, None


def _connection_problem(exc: requests.RequestException) -> str:
    """What went wrong, without the retry wrapper: "Failed to establish a new connection:
    [Errno 111] Connection refused" rather than requests' whole chain."""
    inner = exc.args[0] if exc.args else None
    text = str(getattr(inner, "reason", None) or exc)
    text = re.sub(r"^(<[^<>]*>|\w+\([^()]*\)): ", "", text)   # urllib3's connection object
    return " ".join(text.split()) or type(exc).__name__


def _check_models(label: str, endpoint: Endpoint, model: str, timeout_s: float, get: Get,
                  environ: Mapping[str, str]) -> str | None:
    url = f"{endpoint.url}/v1/models"
    response, problem = _fetch(label, endpoint, url, timeout_s, get, environ)
    if problem:
        return problem
    try:
        served = [entry["id"] for entry in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        return f"{label} at {url}: not an OpenAI model list (expected {{\"data\": [{{\"id\": ...}}]}})"
    if model not in served:
        return f"{label} at {endpoint.url} serves {served}, not {model!r}"
    return None


def _check_metrics(role: str, endpoint: Endpoint, wanted: tuple[str, ...], what: str,
                   timeout_s: float, get: Get, environ: Mapping[str, str]) -> str | None:
    label = f"{role} metrics"
    response, problem = _fetch(label, endpoint, endpoint.url, timeout_s, get, environ)
    if problem:
        return problem
    try:
        names = {sample.name for family in text_string_to_metric_families(response.text)
                 for sample in family.samples}
    except (ValueError, TypeError, IndexError) as exc:
        # the parser quotes the offending text: an HTML error page would fill the line
        reason = " ".join(str(exc).split())[:120]
        return f"{label} at {endpoint.url}: not Prometheus text ({reason})"
    missing = [name for name in wanted if name not in names]
    if missing:
        return f"{label} at {endpoint.url} lack {', '.join(missing)}: is it {what}?"
    return None


# ---- what the verdict and the record can say ---------------------------------------------
def not_available_checks(dep: ExternalDeployment) -> dict[str, str]:
    """Check name -> its line, for each verdict check a user's router cannot support (none with
    the harness proxy, whose records the checks read); harness.judge.verdict.decide takes it."""
    if dep.uses_harness_proxy:
        return {}
    return {name: f"{name}: not available with an external router ({why})"
            for name, why in PROXY_ONLY_CHECKS.items()}


def checks_not_available(dep: ExternalDeployment) -> list[str]:
    """One line per verdict check a user's router cannot support."""
    return list(not_available_checks(dep).values())


def to_record(dep: ExternalDeployment) -> dict[str, Any]:
    """Everything the file said, for the record: environment variables by name, never their
    values (the file holds no secret and nothing here reads the environment)."""
    return {
        "source": dep.source,
        "name": dep.name,
        "model": dep.model,
        "task": dep.task,
        "timeout_s": dep.timeout_s,
        "kv_connector": dep.kv_connector,
        "baseline": dep.baseline.to_dict(),
        "pd": {
            "router": HARNESS_PROXY if dep.router is None else dep.router.to_dict(),
            "prefill": [e.to_dict() for e in dep.prefill],
            "decode": [e.to_dict() for e in dep.decode],
        },
        "metrics": {
            "decode": [e.to_dict() for e in dep.decode_metrics],
            "prefill": [e.to_dict() for e in dep.prefill_metrics],
        },
        "checks_not_available": [] if dep.uses_harness_proxy else list(PROXY_ONLY_CHECKS),
    }
