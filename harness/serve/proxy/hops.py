"""The two hops of one P/D request, without any HTTP: what the prefill and decode servers are
sent, the canary faults on the ``kv_transfer_params`` handed from one hop to the other, and the
record the proxy keeps of each request (``harness.serve.proxy.app`` is the aiohttp app around it).
"""
from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import uuid
from typing import Any, Mapping

__all__ = [
    "FAULT_DROP_TRANSFER",
    "answer_of",
    "FAULT_FOREIGN_PARAMS",
    "FAULT_IDLE_INSTANCE",
    "PROXY_FAULTS",
    "REQUEST_ID_PREFIX",
    "build_decode_body",
    "build_prefill_body",
    "new_record",
    "new_request_id",
    "params_for_decode",
    "tag_for",
    "tag_rules",
    "with_cache_salt",
]

FAULT_DROP_TRANSFER = "drop-transfer"
FAULT_FOREIGN_PARAMS = "foreign-params"
# routes every request to the first prefill and the first decode: the pair's other instances idle
FAULT_IDLE_INSTANCE = "idle-instance"
# Faults the proxy implements itself; any other fault name is passed through and only recorded
# (those are implemented inside vLLM by the harness's fault plugin).
PROXY_FAULTS = (FAULT_DROP_TRANSFER, FAULT_FOREIGN_PARAMS, FAULT_IDLE_INSTANCE)

REQUEST_ID_PREFIX = "pdacc-"

def new_request_id(tag: str = "") -> str:
    """The id both hops of one request carry (``X-Request-Id``). ``tag`` is what a canary's
    requests carry for the decode server's fault plugin (``fault.<kind>.<block>.<value>.``)."""
    return f"{REQUEST_ID_PREFIX}{tag}{uuid.uuid4().hex}"


def tag_for(request_tag: str, body: dict[str, Any], index: int = 0) -> str:
    """The tag this request carries: ``request_tag``, or for ``TAG@RULES`` the tag only where
    the rules say, "" elsewhere. RULES are comma-separated: a share (``0.15``: the tag on a fixed
    share of the questions, by a hash of the prompt, so the same questions every run; a fault on
    some requests only costs a fraction of the accuracy) and ``after=N`` (the tag only from the
    proxy's (N+1)-th request on, `index` counting from 0: a fault that starts late in a long
    run)."""
    tag, _, rules = request_tag.partition("@")
    if not tag or not rules:
        return tag
    share, after = tag_rules(rules)
    if index < after:
        return ""
    if share >= 1:
        return tag
    digest = hashlib.sha256(json.dumps(body.get("prompt"), sort_keys=True).encode()).hexdigest()
    return tag if int(digest[:8], 16) / 0xFFFFFFFF < share else ""


def tag_rules(rules: str) -> tuple[float, int]:
    """(share, after) of a request tag's rules ("0.15", "after=400", "0.15,after=400")."""
    share, after = 1.0, 0
    for rule in filter(None, rules.split(",")):
        if rule.startswith("after="):
            after = int(rule[len("after="):])
        else:
            share = float(rule)
    return share, after


def with_cache_salt(body: dict[str, Any], salt: str | None) -> dict[str, Any]:
    """``body`` with vLLM's ``cache_salt`` (unless the client set one): one evaluation's requests
    never meet another evaluation's prefix-cache blocks on the same servers (a canary's broken
    blocks stay its own; a clean run finds no blocks a canary left)."""
    if not salt or "cache_salt" in body:
        return body
    return {**body, "cache_salt": salt}


def build_prefill_body(original_body: dict[str, Any],
                       prefill_params: Mapping[str, Any]) -> dict[str, Any]:
    """The prefill hop's body: compute the prompt and one token, keep the KV for remote decode
    (``prefill_params``: the connector's ``kv_transfer_params`` that ask for it)."""
    prefill_body = copy.deepcopy(original_body)
    prefill_body["max_tokens"] = 1
    if "max_completion_tokens" in prefill_body:
        prefill_body["max_completion_tokens"] = 1
    # vLLM rejects min_tokens > max_tokens, and the prefill hop only ever makes one token.
    prefill_body.pop("min_tokens", None)
    # n > 1 (OpenAI n, seeded children): the prompt is prefilled once; the decode spawns the children,
    # each reading that one transfer (n prefill children would each hold blocks nobody reads)
    prefill_body.pop("best_of", None)
    if "n" in prefill_body:
        prefill_body["n"] = 1
    prefill_body["stream"] = False
    prefill_body.pop("stream_options", None)
    prefill_body["kv_transfer_params"] = dict(prefill_params)
    return prefill_body


def build_decode_body(
    original_body: dict[str, Any], kv_transfer_params: dict[str, Any] | None
) -> dict[str, Any]:
    """The decode hop's body: the client's original body plus the kv params to pull from.

    With no params the key is left out, so decode recomputes the prompt (what a broken transfer
    looks like, and exactly what the drop-transfer fault simulates)."""
    decode_body = copy.deepcopy(original_body)
    decode_body.pop("kv_transfer_params", None)
    if kv_transfer_params is not None:
        decode_body["kv_transfer_params"] = kv_transfer_params
    return decode_body


def params_for_decode(
    fault: str | None,
    received: dict[str, Any] | None,
    predecessor: dict[str, Any] | None,
) -> tuple[dict[str, Any] | None, bool]:
    """The kv params the decode hop gets, and whether a fault changed them.

    ``received``: the connector's decode params from this request's prefill answer;
    ``predecessor``: those of the previous request. drop-transfer sends none; foreign-params sends the predecessor's
    (not applicable to the first request); any other fault leaves the params alone."""
    if fault == FAULT_DROP_TRANSFER:
        return None, True
    if fault == FAULT_FOREIGN_PARAMS and predecessor is not None:
        return predecessor, True
    return received, False


def new_record(request_id: str, endpoint: str, prefill_url: str, decode_url: str,
               fault: str | None, kv_connector: str) -> dict[str, Any]:
    """A request's record before its hops: every key present, the outcomes still None."""
    return {
        "request_id": request_id,
        "endpoint": endpoint,
        "prefill_url": prefill_url,
        "decode_url": decode_url,
        "prefill_status": None,
        "decode_status": None,
        "received_kv_transfer_params": None,
        "sent_kv_transfer_params": None,
        # what the proxy named for a connector whose prefill answers no params
        "kv_transfer_handle": None,
        "fault": fault,
        "fault_applied": False,
        "kv_connector": kv_connector,   # how sent params derive from received ones
        "prefill_ms": None,
        "decode_ms": None,
        # the prompt's tokens as the prefill counted them (its answer's usage.prompt_tokens)
        "prompt_tokens": None,
        # the children the client asked for (OpenAI n > 1): the decode runs each
        "n": 1,
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        "error": None,
    }


def answer_of(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a request's decode params derive from: the prefill's answer, or where its
    connector's prefill answers none, the handle the proxy named (``kv_transfer_handle``)."""
    return record.get("kv_transfer_handle") or record.get("received_kv_transfer_params")


def forwarded_authorization(headers: Mapping[str, str], forward: bool) -> dict[str, str]:
    """What of the client's Authorization goes on to the servers: all of it when the proxy was
    started to forward it (a deployment file's pd.auth_env), else nothing (a token lm-eval or
    any other client sent is not the servers' business)."""
    authorization = headers.get("Authorization")
    return {"Authorization": authorization} if forward and authorization else {}
