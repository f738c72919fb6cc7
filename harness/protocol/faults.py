"""What the canary fault plugin injects and how it reports it; pure, importable without vLLM.

The decode server's environment picks the fault (:func:`parse_fault_env`):

* ``PD_ACCURACY_FAULT=corrupt-block``: the chosen block's K and V in every attention layer are
  overwritten (``PD_ACCURACY_FAULT_VALUE=zero`` (default) or ``noise``: Gaussian noise at the
  block's own scale).
* ``PD_ACCURACY_FAULT=perturb-kv``: every received block's K and V in every attention layer is
  multiplied by ``1 + scale * N(0, 1)`` (``PD_ACCURACY_FAULT_SCALE``, default 1e-3): a fault the
  size of a bf16/fp8 round-trip that answers, generations and logprobs do not see. Block "all".
* ``PD_ACCURACY_FAULT=swap-blocks``: the chosen block's contents are swapped with the request's
  block at the other end (first <-> last). A request with a single block is skipped.
* ``PD_ACCURACY_FAULT_BLOCK=first|last|<int>`` picks the block by its position in the request's
  received (kernel) block list; an int is 0-based, negative counts from the end. Default first
  (:func:`select_block_positions`).
* ``PD_ACCURACY_FAULT=corrupt-draft-kv``: every received block of the *draft's* attention
  layers (speculative decoding with a draft that has a KV cache of its own: a draft model's
  ``draft_model.*`` layers, an EAGLE head's layers after the target's: :func:`draft_layer_names`)
  is zeroed (``PD_ACCURACY_FAULT_VALUE=noise``: noise), as if the draft's KV had
  not crossed; the target's layers are untouched, so the answers are the same (speculative
  decoding is lossless) and only the draft's proposals suffer. Block "all" unless asked.
* ``PD_ACCURACY_FAULT=wrong-drafts``: the KV is left alone; every draft token the decode's
  proposer (ngram, draft model or EAGLE head) makes for a request is replaced by another token
  (:func:`wrong_draft_token`), so the target rejects the drafts and answers the same: only the
  acceptance of speculative decoding can see it
  (:mod:`harness.serve.plugins.faults.wrong_drafts`). Block and value do not apply.
* ``PD_ACCURACY_FAULT=fail-transfer``: the KV arrives intact, but the decode's connector
  reports the request's read as *failed* (:mod:`harness.serve.plugins.faults.fail_transfer`), so vLLM's
  own failure path runs: the failed-transfer counter, the scheduler's load-failure policy and
  what the client is answered. Block and value do not apply.

``PD_ACCURACY_FAULT=by-request`` arms the same hooks without a fault of their own: a request is
broken only when its id carries a fault tag (:func:`request_fault_tag`, put there by the harness's
proxy for a canary's requests; :func:`parse_request_fault` reads it back), so canaries share the
clean cell's servers and every other request passes untouched.

Each broken request (corrupted KV, or a read reported failed) gives one WARNING line starting
with :data:`APPLIED_PREFIX`; a request the fault could not be applied to gives one line starting
with :data:`SKIPPED_PREFIX` (:func:`format_fault_line`). :func:`parse_fault_log` reads them back
for the harness.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

FAULT_ENV = "PD_ACCURACY_FAULT"
BLOCK_ENV = "PD_ACCURACY_FAULT_BLOCK"
VALUE_ENV = "PD_ACCURACY_FAULT_VALUE"
SHARE_ENV = "PD_ACCURACY_FAULT_SHARE"   # by-request only: break this share of the questions
AFTER_ENV = "PD_ACCURACY_FAULT_AFTER"   # by-request only: break no request before the (N+1)-th
KV_FAULT_KINDS = ("corrupt-block", "swap-blocks", "perturb-kv", "corrupt-draft-kv")  # break the
# received KV
DRAFT_KV = "corrupt-draft-kv"       # the draft's layers only
DRAFT_LAYER_MARK = "draft_model."   # vLLM names a draft model's attention layers draft_model.<...>
# vLLM's speculative methods whose head numbers its layers after the target's (an EAGLE head of a
# 4-layer target caches model.layers.4.self_attn.attn)
HEAD_DRAFT_METHODS = ("eagle", "eagle3", "mtp")
# an MTP head whose model names its layers mtp.layers.<i> instead (vLLM 0.32's Qwen3NextMTP:
# mtp.layers.0.self_attn.attn beside a 3-layer target's model.layers.1-2)
MTP_LAYER_MARK = "mtp."
_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")
WRONG_DRAFTS = "wrong-drafts"       # the decode's proposer's draft tokens, not its KV
FAIL_TRANSFER = "fail-transfer"                      # report an intact read as failed
EARLY_RELEASE = "early-release"     # the prefill holds a request's blocks for HOLD_ENV s only
PREFILL_FAULT_KINDS = (EARLY_RELEASE,)
FAULT_KINDS = KV_FAULT_KINDS + (FAIL_TRANSFER, WRONG_DRAFTS) + PREFILL_FAULT_KINDS
PREFILL_FAULT_ENV = "PD_ACCURACY_PREFILL_FAULT"   # by-request: arms the prefill's hooks
HOLD_ENV = "PD_ACCURACY_FAULT_HOLD_S"
DEFAULT_HOLD_S = 0.5
BY_REQUEST = "by-request"          # PD_ACCURACY_FAULT value: the fault comes with each request
FAULT_VALUES = ("zero", "noise")
BLOCK_NAMES = ("first", "last", "all")
SCALE_ENV = "PD_ACCURACY_FAULT_SCALE"    # perturb-kv: the relative noise's scale
DEFAULT_PERTURB_SCALE = 1e-3

APPLIED_PREFIX = "pd-accuracy fault:"
SKIPPED_PREFIX = "pd-accuracy fault-skipped:"
ARMED_PREFIX = "pd-accuracy fault-armed:"
SETUP_PREFIX = "pd-accuracy fault-setup:"


@dataclass(frozen=True)
class FaultSpec:
    """What to break: ``kind`` in FAULT_KINDS, ``block`` "first"/"last"/position, ``value``."""

    kind: str
    block: str | int = "first"
    value: str = "zero"


@dataclass(frozen=True)
class FaultOutcome:
    """What happened to one request: block ids touched per attention group, or why not."""

    applied: bool
    block_ids: tuple[tuple[int, ...], ...] = ()
    num_layers: int = 0
    reason: str = ""


@dataclass(frozen=True)
class FaultLogLine:
    """One parsed fault line of a decode server log."""

    applied: bool
    kind: str
    request_id: str
    block_ids: tuple[tuple[int, ...], ...]
    num_layers: int
    reason: str


def _positive(env: Mapping[str, str], name: str, default: float, what: str) -> float:
    """The positive number variable `name` of ``env`` holds (`default` when unset or empty);
    ValueError names the variable and the `what` it expected."""
    raw = env.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a {what}") from None
    if not value > 0:
        raise ValueError(f"{name}={raw!r}: expected a positive {what}")
    return value


def perturb_scale(env: Mapping[str, str]) -> float:
    """perturb-kv's relative noise scale from ``env`` (PD_ACCURACY_FAULT_SCALE, default 1e-3)."""
    return _positive(env, SCALE_ENV, DEFAULT_PERTURB_SCALE, "scale")


def hold_seconds(env: Mapping[str, str]) -> float:
    """early-release's hold from ``env`` (PD_ACCURACY_FAULT_HOLD_S, default 0.5 s)."""
    return _positive(env, HOLD_ENV, DEFAULT_HOLD_S, "number of seconds")


def parse_fault_env(env: Mapping[str, str]) -> FaultSpec | None:
    """The fault asked for by ``env``, or None when PD_ACCURACY_FAULT is unset/empty.

    Raises ValueError on an unknown fault, block selector or value.
    """
    kind = env.get(FAULT_ENV, "").strip()
    if not kind:
        return None
    if kind == BY_REQUEST:
        return FaultSpec(kind=BY_REQUEST)
    if kind not in FAULT_KINDS:
        raise ValueError(f"{FAULT_ENV}={kind!r}: expected one of {FAULT_KINDS}")
    raw_block = env.get(BLOCK_ENV, "").strip() or ("all" if kind in ("perturb-kv", DRAFT_KV)
                                                   else "first")
    block: str | int
    if raw_block in BLOCK_NAMES:
        block = raw_block
    else:
        try:
            block = int(raw_block)
        except ValueError:
            raise ValueError(
                f"{BLOCK_ENV}={raw_block!r}: expected first, last or an integer position"
            ) from None
    value = env.get(VALUE_ENV, "").strip() or ("noise" if kind == "perturb-kv" else "zero")
    if value not in FAULT_VALUES:
        raise ValueError(f"{VALUE_ENV}={value!r}: expected one of {FAULT_VALUES}")
    return FaultSpec(kind=kind, block=block, value=value)


_TAG_RE = re.compile(r"pdacc-fault\.(?P<kind>[a-z-]+)\.(?P<block>[^.]+)\.(?P<value>[a-z]+)\.")


def request_fault_tag(spec: FaultSpec) -> str:
    """What a canary request's id carries after ``pdacc-``: ``fault.<kind>.<block>.<value>.``"""
    return f"fault.{spec.kind}.{spec.block}.{spec.value}."


def request_tag_for(fault: str | None, fault_env: tuple[tuple[str, str], ...] = ()) -> str:
    """The tag of a server-side canary's requests (its block/value from the cell's
    PD_ACCURACY_FAULT_* env), with the proxy's rules (harness.serve.proxy.hops.tag_for) after
    ``@``: the share of the questions when PD_ACCURACY_FAULT_SHARE asks for the fault on that
    share only, ``after=N`` when PD_ACCURACY_FAULT_AFTER starts it at the proxy's (N+1)-th
    request; "" for any other cell."""
    if fault not in FAULT_KINDS:
        return ""
    env = dict(fault_env)
    spec = parse_fault_env({FAULT_ENV: fault, **env})
    if not spec:
        return ""
    rules = []
    share = env.get(SHARE_ENV, "").strip()
    if share:
        if not 0 < float(share) <= 1:
            raise ValueError(f"{SHARE_ENV}={share!r}: expected a share in (0, 1]")
        rules.append(str(float(share)))
    after = env.get(AFTER_ENV, "").strip()
    if after:
        if not after.isdigit():
            raise ValueError(f"{AFTER_ENV}={after!r}: expected a whole number of requests")
        rules.append(f"after={int(after)}")
    return request_fault_tag(spec) + (f"@{','.join(rules)}" if rules else "")


def parse_request_fault(request_id: str) -> FaultSpec | None:
    """The fault a request id carries (vLLM keeps the proxy's X-Request-Id inside its own id),
    or None for a request to leave alone."""
    match = _TAG_RE.search(request_id)
    if match is None or match["kind"] not in FAULT_KINDS or match["value"] not in FAULT_VALUES:
        return None
    raw = match["block"]
    block: str | int = raw if raw in BLOCK_NAMES else int(raw) if raw.lstrip("-").isdigit() else ""
    if block == "":
        return None
    return FaultSpec(kind=match["kind"], block=block, value=match["value"])


def select_block_positions(num_blocks: int, spec: FaultSpec) -> tuple[int, ...] | None:
    """Positions in a request's block list the fault touches, or None if it cannot apply.

    corrupt-block -> ``(chosen,)``; swap-blocks -> ``(chosen, partner)`` where partner is the
    last block, or the first when the chosen one is the last. A position outside the list, an
    empty list, or a swap on a single block gives None.
    """
    if num_blocks <= 0:
        return None
    if spec.block == "all":
        return tuple(range(num_blocks)) if spec.kind != "swap-blocks" else None
    if spec.block == "first":
        chosen = 0
    elif spec.block == "last":
        chosen = num_blocks - 1
    else:
        chosen = int(spec.block)
        if chosen < 0:
            chosen += num_blocks
        if not 0 <= chosen < num_blocks:
            return None
    if spec.kind in ("corrupt-block", DRAFT_KV):
        return (chosen,)
    if spec.kind == "perturb-kv":
        return tuple(range(num_blocks))
    if num_blocks < 2:
        return None
    partner = num_blocks - 1 if chosen != num_blocks - 1 else 0
    return (chosen, partner)


def wrong_draft_token(token: int, vocab_size: int) -> int:
    """wrong-drafts' replacement of a draft token: half the vocabulary away, so that the target
    almost never samples it (a neighbouring id could be the next digit of an answer)."""
    return (int(token) + max(vocab_size, 2) // 2) % max(vocab_size, 2)


def is_draft_layer(name: str) -> bool:
    """Whether a KV cache layer is a draft model's by its name alone (``draft_model.*``)."""
    return name.startswith(DRAFT_LAYER_MARK)


def draft_layer_names(names: Any, method: str | None, target_layers: int | None) -> frozenset:
    """The KV cache layers among ``names`` that belong to the server's drafter (corrupt-draft-kv's
    layers, the digest's draft layers): a draft model's ``draft_model.*`` layers; under an EAGLE
    or MTP ``method``, the layers numbered from the target's layer count ``target_layers`` on
    (vLLM's EAGLE heads continue the target's numbering: ``model.layers.4.*`` after a 4-layer
    target's 0-3), and under ``mtp`` the ``mtp.*`` layers (Qwen3-Next's MTP head numbers its
    own: ``mtp.layers.0.*``)."""
    found = {name for name in names if is_draft_layer(name)
             or (method == "mtp" and name.startswith(MTP_LAYER_MARK))}
    if method in HEAD_DRAFT_METHODS and target_layers is not None:
        for name in names:
            index = _LAYER_INDEX.search(name)
            if index and int(index.group(1)) >= target_layers:
                found.add(name)
    return frozenset(found)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def format_fault_line(request_id: str, spec: FaultSpec, outcome: FaultOutcome) -> str:
    """The one log line for a request; applied and skipped lines have distinct prefixes."""
    blocks = _compact([list(ids) for ids in outcome.block_ids])
    # block and value only steer the KV faults; a failed transfer names the blocks vLLM is told
    # did not load (layers=0: no cache was touched)
    selector = f" selector={spec.block}" if spec.kind in KV_FAULT_KINDS else ""
    if outcome.applied:
        value = f" value={spec.value}" if spec.kind in ("corrupt-block", DRAFT_KV) else ""
        return (
            f"{APPLIED_PREFIX} fault={spec.kind} request={request_id} block_ids={blocks} "
            f"layers={outcome.num_layers}{selector}{value}"
        )
    return (
        f"{SKIPPED_PREFIX} fault={spec.kind} request={request_id}{selector} "
        f"reason={outcome.reason or 'unknown'}"
    )


_LINE_RE = re.compile(
    r"(?P<prefix>pd-accuracy fault(?:-skipped)?:) fault=(?P<kind>\S+) request=(?P<request>\S+)"
    r"(?: block_ids=(?P<blocks>\S+) layers=(?P<layers>\d+))?.*?(?: reason=(?P<reason>\S+))?$"
)


def parse_fault_log(log_text: str) -> list[FaultLogLine]:
    """Every applied/skipped fault line in ``log_text`` (a decode server log), in order."""
    lines = []
    for raw_line in log_text.splitlines():
        if "pd-accuracy fault" not in raw_line:
            continue
        match = _LINE_RE.search(raw_line)
        if match is None:
            continue
        blocks = json.loads(match["blocks"]) if match["blocks"] else []
        lines.append(
            FaultLogLine(
                applied=match["prefix"] == APPLIED_PREFIX,
                kind=match["kind"],
                request_id=match["request"],
                block_ids=tuple(tuple(group) for group in blocks),
                num_layers=int(match["layers"] or 0),
                reason=match["reason"] or "",
            )
        )
    return lines
