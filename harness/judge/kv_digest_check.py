"""The kv-digest check: the decode held, byte for byte, the prompt KV its own prefill computed.

Its input is the summary harness.run.evidence.kv_digest_evidence builds from both sides' digests. It
fails on any request whose digests differ (naming the first differing layer, K/V, head, token
range and decode block, and the share of requests affected), whose decode covered other prompt
positions than the prefill computed, or that could not be compared at all (a side wrote no
digest: the decode never received, say). What it cannot see: a decode that *reads* the right
bytes through a wrong block table (harness README, "What each check catches").
:func:`compare_digests` compares one request's two sides, entry by entry.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from harness.protocol.kv_digest import KV_NAMES, STATE, KVDigest, LayerKey


def describe(evidence: dict) -> tuple[bool, str]:
    """(passed, one line) of the kv-digest check."""
    e = evidence
    n, compared = e["requests"], e["compared"]
    missing = (f"; no digest from prefill on {e['missing_prefill']}, from decode on "
               f"{e['missing_decode']}" if e["missing_prefill"] or e["missing_decode"] else "")
    if e["differing"]:
        f = e["first_mismatch"]
        if f.get("coverage"):
            low, high, total = f["coverage"]
            return False, (f"decode received prompt tokens {low}-{high - 1} of {total} on "
                           f"{f['request_id']} ({e['differing']}/{compared} requests differ)"
                           f"{missing}")
        draft = " (the draft's)" if f.get("draft") else ""
        where = (f"layer {f['layer']}{draft} {f['kv']} head {f['head']} tokens "
                 f"{f['token_range'][0]}-{f['token_range'][1] - 1} (decode block "
                 f"{f['decode_block']})" if f["token_range"] else f"layer {f['layer']} state")
        return False, (f"prompt KV differs on {e['differing']}/{compared} requests "
                       f"({100 * e['differing'] / compared:.0f}%); first at {where} of "
                       f"{f['request_id']}, {f['differing_entries']}/{f['entries']} entries "
                       f"differ; {entered(e, f)}{missing}")
    if compared == 0 or compared < n:
        why = max((e.get("skipped_layers") or {}).items(), key=lambda item: item[1],
                  default=(None, 0))[0]
        return False, (f"KV digests compared on {compared}/{n} requests only{missing}"
                       + (f"; not digested: {e['not_digested']}" if e["not_digested"] else "")
                       + (f" ({why})" if e["not_digested"] and why else ""))
    drafts = e.get("draft_layers")
    return True, (f"identical on {compared}/{n} requests"
                  + (f", the draft's layers among them ({', '.join(drafts)})" if drafts else ""))


def entered(e: dict, first: dict) -> str:
    """Where the corruption entered, from the raw bytes the connector wrote (before
    post-processing)."""
    raw = first.get("raw")
    who = e.get("connector") or "the connector"
    counts = (f" ({e.get('raw_identical', 0)} requests with the bytes as sent, "
              f"{e.get('raw_differing', 0)} not)")
    if raw is None:
        return "where it entered is unknown (no raw bytes from a side)"
    if raw.get("host_copy"):
        tokens = raw.get("token_range") or [0, 0]
        return (f"entered on the prefill, before the transfer: its host buffer (what {who} "
                f"sends) differs from its KV cache from layer {raw['layer']} tokens "
                f"{tokens[0]}-{tokens[1] - 1} on: the copy into it missed or changed them "
                f"({e.get('host_copy_differing', 0)} requests)")
    if raw:
        return (f"entered in the transfer: the bytes {who} wrote differ from those sent from "
                f"prefill block {raw['prefill_block']} of layer {raw['layer']} on{counts}")
    return (f"entered after the transfer: {who} wrote the bytes exactly as sent, the decode's "
            f"post-processing (block size / layout) or later changed them{counts}")


@dataclass(frozen=True)
class DigestMismatch:
    """The first differing entry (layers in the prefill side's order, then K before V, head,
    token range) and how many entries differ in all. ``kv`` is ``"state"`` for an SSM state,
    whose ``head`` and ``token_range`` are None."""

    layer: LayerKey
    kv: str
    head: int | None
    token_range: tuple[int, int] | None
    differing: int
    total: int

    @property
    def share(self) -> float:
        return self.differing / self.total if self.total else 0.0


def compare_digests(prefill: Mapping[LayerKey, KVDigest | str],
                    decode: Mapping[LayerKey, KVDigest | str], *,
                    shared_heads_only: bool = False, received_only: bool = False
                    ) -> DigestMismatch | None:
    """The first difference between two sides' per-layer digests, or None when identical.

    An entry present on one side only counts as differing. ``shared_heads_only`` compares only
    the heads both sides hold in a layer (one decode TP rank against the full prefill side).
    ``received_only`` compares only the prompt positions the decode side's digest covers (it
    received the tail after a local prefix-cache hit); its first chunk, when that starts off a
    chunk boundary, has no prefill counterpart and is left out.
    """
    first: tuple[Any, ...] | None = None
    differing = total = 0
    for layer in list(prefill) + [layer for layer in decode if layer not in prefill]:
        ours, theirs = prefill.get(layer), decode.get(layer)
        if isinstance(ours, str) or isinstance(theirs, str):
            pairs = [((STATE, None, None), ours, theirs)]
        else:
            mine = ours.entries() if ours else {}
            other = theirs.entries() if theirs else {}
            if shared_heads_only and ours and theirs:
                shared = set(ours.heads) & set(theirs.heads)
                mine, other = ({k: v for k, v in e.items() if k[1] in shared}
                               for e in (mine, other))
            if received_only and ours and theirs:
                low, high = theirs.token_offset, theirs.token_offset + theirs.num_tokens
                mine = {k: v for k, v in mine.items() if low <= k[2][0] and k[2][1] <= high}
                if low % theirs.token_chunk:
                    other = {k: v for k, v in other.items() if k[2][0] != low}
            keys = sorted(mine.keys() | other.keys(), key=lambda k: (KV_NAMES.index(k[0]), *k[1:]))
            pairs = [(key, mine.get(key), other.get(key)) for key in keys]
        for key, our_hash, their_hash in pairs:
            total += 1
            if our_hash != their_hash:
                differing += 1
                first = first or (layer, *key)
    if first is None:
        return None
    return DigestMismatch(*first, differing=differing, total=total)
