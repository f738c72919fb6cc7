"""A cell's KV digest evidence: did the decode hold, for every request, the prompt KV its own
prefill computed? Read from the digest files the P/D servers wrote
(harness.protocol.kv_digest) and joined through the proxy's records:

* the prefill's line is the one of the request id its response named (``remote_request_id`` in
  the kv_transfer_params the proxy *received*: the question's own prefill), or, for a connector
  whose prefill answers none, the one whose id carries the proxy id of the transfer
  the proxy named;
* the decode's line is the one whose vLLM request id carries the proxy's id (``X-Request-Id``);
  for a connector whose hops carry no params at all (ExampleConnector), the prefill's line is
  found the same way: the prefill the proxy sent that request to.

So a decode that read another request's blocks (foreign params) differs from its question's
prefill even though the bytes it read were intact. Per request the two sides' digests are
compared on the prompt positions the decode received (harness.judge.kv_digest_check); the
summary names the first differing layer, K/V, head, token range and decode block, and the share
of requests affected. Servers share the digest files across cells: only this cell's records
are looked at.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Iterable

from harness.connectors import DEFAULT_KV_CONNECTOR, KV_CONNECTORS
from harness.judge.kv_digest_check import compare_digests
from harness.protocol.kv_digest import (COST_PARTS, HASH_ENV, LEGACY_HASH, RAW_PIECE_TOKENS,
                                        layers_of, merge_tp_ranks, read_digest_lines)

_UUID = re.compile(r"[0-9a-f]{32}")
# a child of a request asking OpenAI n > 1: vLLM's ParentRequest names child i
# "<i>_<parent id>"; its row is "<proxy request id>#<i>"
_CHILD = re.compile(r"^(\d+)_")
CHILD_MARK = "#"


def child_of(request_id: str) -> int | None:
    """The child index of a vLLM request id ("1_cmpl-..." -> 1), None for a parent's own."""
    found = _CHILD.match(request_id or "")
    return int(found.group(1)) if found else None


def parent_id(row_id: object) -> str:
    """The proxy's request id of a row (a child's parent's; any other row's own)."""
    return str(row_id).split(CHILD_MARK, 1)[0]


def hash_difference(ours: dict, theirs: dict) -> str | None:
    """Why two sides' digests cannot be compared: they hashed with different functions (a
    different hash is no evidence the bytes differ), else None."""
    if ours["hash"] == theirs["hash"]:
        return None
    return (f"the prefill hashed with {ours['hash']}, the decode with {theirs['hash']}: "
            f"set {HASH_ENV} alike on both")


def raw_difference(ours: dict, theirs: dict) -> dict | None:
    """Where the bytes the connector wrote into the decode (before its post-processing) first differ
    from the bytes the prefill sent: ``{"layer", "piece", "prefill_block"}`` (the request's
    prefill blocks counted from 0), ``{}`` when identical, None when a side has no raw bytes."""
    sent, got = ours.get("raw") or {}, theirs.get("raw") or {}
    layers = [name for name in sent if name in got]
    if not layers:
        return None
    skip = int(theirs.get("token_offset") or 0) // RAW_PIECE_TOKENS
    for name in layers:
        mine, other = sent[name]["pieces"][skip:], got[name]["pieces"]
        for piece in range(min(len(mine), len(other))):
            if mine[piece] != other[piece]:
                per_block = max(1, int(sent[name]["block_tokens"]) // RAW_PIECE_TOKENS)
                return {"layer": name, "piece": skip + piece,
                        "prefill_block": (skip + piece) // per_block}
    return {}


def host_copy_difference(ours: dict) -> dict | None:
    """Where the prefill's host buffer (what the connector sends, on a GPU with ``kv_buffer_device:
    cpu``) first differs from its KV cache: ``{"host_copy": True, "layer", "token_range"}``;
    None when it has no host buffer or the two agree."""
    host = ours.get("host_digests")
    if not host:
        return None
    mismatch = compare_digests({k: v for k, v in ours["digests"].items() if k in host}, host)
    if mismatch is None:
        return None
    return {"host_copy": True, "layer": mismatch.layer,
            "token_range": list(mismatch.token_range) if mismatch.token_range else None}


def side_of(lines: list[dict]) -> dict:
    """One side of a request from its TP ranks' lines (one per rank, the first kept): the
    ranks' digests merged into all heads (harness.protocol.kv_digest.merge_tp_ranks); raw
    bytes only from a single rank (a rank's bytes hold its own heads only)."""
    ranks: dict[int, dict] = {}
    for line in lines:
        ranks.setdefault(int(line.get("tp_rank") or 0), line)
    ordered = [ranks[r] for r in sorted(ranks)]
    first = ordered[0]
    skipped = {f"{name}@{line.get('tp_rank', 0)}": why for line in ordered
               for name, why in (line.get("skipped") or {}).items()}
    error = next((l["error"] for l in ordered if l.get("error")), None)
    try:
        digests = (layers_of(first) if len(ordered) == 1
                   else merge_tp_ranks([layers_of(line) for line in ordered]))
    except ValueError as exc:      # a rank's line is missing, or ranks disagree on tokens
        digests, error = {}, f"TP ranks' digests do not merge: {exc}"
    return {"num_tokens": first.get("num_tokens"), "token_offset": first.get("token_offset"),
            "hash": first.get("hash") or LEGACY_HASH,
            "elapsed_s": sum(float(line.get("elapsed_s") or 0) for line in ordered),
            "parts_s": {part: sum(float(line.get(part) or 0) for line in ordered)
                        for part in COST_PARTS},
            "skipped": skipped, "error": error,
            "draft_layers": sorted({n for line in ordered for n in line.get("draft_layers") or ()}),
            "digests": digests, "raw": first.get("raw") if len(ordered) == 1 else {},
            "host_digests": (layers_of({"layers": first["host_layers"]})
                             if len(ordered) == 1 and first.get("host_layers") else None),
            "ranks": len(ordered)}


def _proxy_uuid(request_id: str) -> str | None:
    found = _UUID.findall(request_id or "")
    return found[-1] if found else None


def _index(prefill_files: Iterable[str], decode_files: Iterable[str]
           ) -> tuple[dict[str, list[dict]], dict[str, list[dict]], dict[str, list[dict]]]:
    """The digest lines of both sides: the prefill's by vLLM request id and by the proxy's id
    (the uuid inside vLLM's), the decode's by the proxy's id."""
    by_prefill_id: dict[str, list[dict]] = {}
    by_prefill_uuid: dict[str, list[dict]] = {}
    for line in read_digest_lines(prefill_files):
        if line.get("side") == "prefill":
            by_prefill_id.setdefault(line["request_id"], []).append(line)
            by_prefill_uuid.setdefault(_proxy_uuid(line["request_id"]) or "", []).append(line)
    by_uuid: dict[str, list[dict]] = {}
    for line in read_digest_lines(decode_files):
        key = _proxy_uuid(line.get("request_id", "")) if line.get("side") == "decode" else None
        child = child_of(line.get("request_id", ""))
        if key:   # a child's lines apart: "<uuid>#<i>"
            by_uuid.setdefault(key if child is None else f"{key}{CHILD_MARK}{child}",
                               []).append(line)
    return by_prefill_id, by_prefill_uuid, by_uuid


def _sides(record: dict, index: tuple[dict[str, list[dict]], dict[str, list[dict]],
                                     dict[str, list[dict]]]) -> tuple[dict | None, dict | None]:
    """(prefill side, decode side) of one proxy record's request; None where it has no line."""
    by_prefill_id, by_prefill_uuid, by_uuid = index
    received = record.get("received_kv_transfer_params") or {}
    ours = by_prefill_id.get(received.get("remote_request_id"))
    handle = record.get("kv_transfer_handle") or {}
    if ours is None and handle:
        # a connector whose prefill answers nothing: the prefill the proxy's
        # handle names, by the proxy id in its transfer id
        ours = by_prefill_uuid.get(_proxy_uuid(str(handle.get("transfer_id", ""))) or "-")
    if ours is None and not received and not handle and _without_params(record):
        # a connector whose hops carry no params (ExampleConnector: the decode loads by the
        # prompt's hash): the prefill the proxy sent this same request to
        ours = by_prefill_uuid.get(_proxy_uuid(record.get("request_id", "")) or "-")
    key = _proxy_uuid(record.get("request_id", "")) or ""
    # a request of n > 1 children: its first child stands for it (each child: child_digests)
    theirs = by_uuid.get(key) or by_uuid.get(f"{key}{CHILD_MARK}0")
    return tuple(side_of(lines) if lines else None for lines in (ours, theirs))  # type: ignore[return-value]


def _without_params(record: dict) -> bool:
    row = KV_CONNECTORS.get(record.get("kv_connector") or DEFAULT_KV_CONNECTOR)
    return row is not None and row.no_params is not None


def request_digests(records: list[dict], prefill_files: Iterable[str],
                    decode_files: Iterable[str], decode_block_size: int
                    ) -> dict[str, tuple[str, str]]:
    """Per request (the proxy's id): ("identical" | "differs" | "missing" | "not-digested",
    the detail), for the verdict under weather (harness.judge.weather)."""
    index = _index(prefill_files, decode_files)
    out: dict[str, tuple[str, str]] = {}
    for record in records:
        ours, theirs = _sides(record, index)
        rid = str(record.get("request_id"))
        out.update(child_digests(record, ours, index[2], decode_block_size))
        out[rid] = request_digest(ours, theirs, decode_block_size)
    return out


def child_digests(record: dict, ours: dict | None, by_uuid: dict[str, list[dict]],
                  decode_block_size: int) -> dict[str, tuple[str, str]]:
    """Each child's digest of a request of n > 1 children ("<proxy id>#<i>"), against the one
    prefill's: every child must hold the KV that request's prefill computed."""
    rid, key = str(record.get("request_id")), _proxy_uuid(record.get("request_id", ""))
    prefix = f"{key}{CHILD_MARK}"
    return {f"{rid}{CHILD_MARK}{k[len(prefix):]}":
            request_digest(ours, side_of(lines), decode_block_size)
            for k, lines in by_uuid.items() if key and k.startswith(prefix)}


def request_digest(ours: dict | None, theirs: dict | None, decode_block_size: int
                   ) -> tuple[str, str]:
    """One request's (or child's) ("identical" | "differs" | "missing" | "not-digested",
    the detail)."""
    if ours is None or theirs is None:
        missing = " and ".join(side for side, got in (("prefill", ours), ("decode", theirs))
                               if got is None)
        return "missing", f"no {missing} digest"
    if not ours["digests"] or not theirs["digests"] or hash_difference(ours, theirs):
        return "not-digested", (hash_difference(ours, theirs) or ours["error"]
                                or theirs["error"] or "no layer digested")
    mismatch = compare_digests(ours["digests"], theirs["digests"], received_only=True)
    offset = int(theirs.get("token_offset") or 0)
    covered = offset + int(theirs.get("num_tokens") or 0)
    if mismatch is None and covered != int(ours.get("num_tokens") or 0):
        return "differs", (f"the decode holds tokens {offset}-{covered} of the "
                           f"prefill's {ours.get('num_tokens')}")
    if mismatch is None:
        return "identical", ""
    start = mismatch.token_range[0] if mismatch.token_range else None
    block = "" if start is None else f", decode block {start // decode_block_size}"
    return "differs", (f"first at {mismatch.layer} {mismatch.kv} head {mismatch.head} "
                       f"tokens {list(mismatch.token_range or [])}{block}")


def digest_evidence(records: list[dict], prefill_files: Iterable[str],
                    decode_files: Iterable[str], decode_block_size: int,
                    connector: str = "the connector") -> dict:
    """The kv-digest summary of one evaluation (TransferProof.kv_digest); ``connector``: the
    word for what moved the KV, as the verdict says it."""
    index = _index(prefill_files, decode_files)
    counts: Counter = Counter()
    skipped: Counter = Counter()
    first: dict | None = None
    cost = {"prefill_s": 0.0, "decode_s": 0.0}
    parts = dict.fromkeys(COST_PARTS, 0.0)
    functions: Counter = Counter()
    drafts: set[str] = set()     # the drafter's layers the compared digests held
    for record in records:
        counts["requests"] += 1
        ours, theirs = _sides(record, index)
        if ours is None:
            counts["missing_prefill"] += 1
        if theirs is None:
            counts["missing_decode"] += 1
        if ours is None or theirs is None:
            continue
        cost["prefill_s"] += float(ours.get("elapsed_s") or 0)
        cost["decode_s"] += float(theirs.get("elapsed_s") or 0)
        for side in (ours, theirs):
            functions[side["hash"]] += 1
            for part in COST_PARTS:
                parts[part] += side["parts_s"][part]
        for side in (ours, theirs):
            skipped.update(set(side["skipped"].values()))
            if side["error"]:
                skipped[side["error"]] += 1
        p_layers, d_layers = ours["digests"], theirs["digests"]
        if hash_difference(ours, theirs):
            skipped[hash_difference(ours, theirs)] += 1
        if not p_layers or not d_layers or hash_difference(ours, theirs):
            counts["not_digested"] += 1
            continue
        counts["compared"] += 1
        draft_layers = set(ours.get("draft_layers") or ()) | set(theirs.get("draft_layers") or ())
        drafts |= draft_layers
        mismatch = compare_digests(p_layers, d_layers, received_only=True)
        covered = int(theirs.get("token_offset") or 0) + int(theirs.get("num_tokens") or 0)
        if mismatch is None and covered != int(ours.get("num_tokens") or 0):
            counts["differing"] += 1
            first = first or {"request_id": record.get("request_id"), "layer": None,
                              "kv": None, "head": None, "token_range": None,
                              "coverage": [int(theirs.get("token_offset") or 0), covered,
                                           int(ours.get("num_tokens") or 0)]}
            continue
        if mismatch is None:
            counts["identical"] += 1
            continue
        counts["differing"] += 1
        raw = host_copy_difference(ours) or raw_difference(ours, theirs)
        counts["raw_unknown" if raw is None else "host_copy_differing" if raw.get("host_copy")
               else "raw_differing" if raw else "raw_identical"] += 1
        if first is None:
            start = mismatch.token_range[0] if mismatch.token_range else None
            first = {"request_id": record.get("request_id"), "layer": mismatch.layer,
                     "kv": mismatch.kv, "head": mismatch.head,
                     "token_range": list(mismatch.token_range) if mismatch.token_range else None,
                     "decode_block": None if start is None else start // decode_block_size,
                     "differing_entries": mismatch.differing, "entries": mismatch.total,
                     "raw": raw, **({"draft": True} if mismatch.layer in draft_layers else {})}
    return {**{k: counts[k] for k in ("requests", "compared", "identical", "differing",
                                      "missing_prefill", "missing_decode", "not_digested",
                                      "raw_identical", "raw_differing", "raw_unknown",
                                      "host_copy_differing")},
            "first_mismatch": first, "skipped_layers": dict(skipped), "connector": connector,
            **({"draft_layers": sorted(drafts)} if drafts else {}),
            "cost_s": {k: round(v, 4) for k, v in cost.items()},
            "cost_parts_s": {k: round(v, 4) for k, v in parts.items()},
            "hash_functions": dict(functions)}


__all__ = ["CHILD_MARK", "child_of", "digest_evidence", "parent_id", "read_digest_lines",
           "request_digests"]
