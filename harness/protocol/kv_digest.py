"""The KV digest record: the file each P/D server appends a request's prompt-KV digests to, one
JSON line per request and side, and how it is read back.

The in-server digest plugin (harness.serve.plugins.kv_digest) is armed by
:data:`DIGEST_FILE_ENV` and hashes with the function :data:`HASH_ENV` names; it writes
:func:`record_line`. The harness reads the file with :func:`read_digest_lines` and a line's
per-layer digests with :func:`layers_of` (harness.run.evidence.kv_digest_evidence joins the two
sides, harness.judge.kv_digest_check compares them). A layer's digest is a :class:`KVDigest`:
hashes per (K/V, head, token chunk), token chunks aligned to absolute prompt positions.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Union

DIGEST_FILE_ENV = "PD_ACCURACY_KV_DIGEST_FILE"
HASH_ENV = "PD_ACCURACY_KV_DIGEST_HASH"
# env value -> the function's name in every digest line (two sides are compared only when
# they name the same one)
HASH_FUNCTIONS = {"device": "fmix64-sum", "blake2b": "blake2b-64"}
DEFAULT_HASH = "device"
LEGACY_HASH = HASH_FUNCTIONS["blake2b"]     # lines written before they named their hash
RAW_PIECE_TOKENS = 16     # raw-byte pieces: a 16-token share of a block's bytes (GPU blocks are
                          # multiples of 16), so P64 blocks line up with D128 block halves
# what a line's elapsed_s is made of: on the engine's step, GPU time of the hash kernels and
# copies, and resolving the digests off the step
COST_PARTS = ("step_s", "device_s", "resolve_s")

KV_NAMES = ("K", "V")
STATE = "state"
LayerKey = Union[str, int]


def hash_choice(environ: Any = None) -> str:
    """The hash the environment asks for (``device`` when unset); ValueError on another."""
    value = (environ if environ is not None else os.environ).get(HASH_ENV, "").strip().lower()
    if not value:
        return DEFAULT_HASH
    if value not in HASH_FUNCTIONS:
        raise ValueError(f"{HASH_ENV}={value[:40]!r}: must be one of "
                         f"{', '.join(sorted(HASH_FUNCTIONS))}")
    return value


@dataclass(frozen=True)
class KVDigest:
    """Hashes of one attention layer's canonical KV: ``hashes[kv][local head][token chunk]``.

    Heads are ``head_offset .. head_offset + num_heads - 1`` in GLOBAL numbering, so a TP rank's
    digest lines up with the full-head one. Tokens are prompt positions ``token_offset ..
    token_offset + num_tokens - 1``; chunk boundaries fall on multiples of ``token_chunk`` in
    that absolute numbering, chunk ``c`` covering ``token_range(c)``.
    """

    head_offset: int
    num_tokens: int
    token_chunk: int
    dtype: str
    hashes: tuple[tuple[tuple[str, ...], ...], ...]
    token_offset: int = 0

    @property
    def num_heads(self) -> int:
        return len(self.hashes[0])

    @property
    def heads(self) -> range:
        return range(self.head_offset, self.head_offset + self.num_heads)

    def token_range(self, chunk: int) -> tuple[int, int]:
        """Absolute prompt positions ``[start, end)`` of chunk ``chunk``."""
        return chunk_bounds(self.token_offset, self.num_tokens, self.token_chunk)[chunk]

    def entries(self) -> dict[tuple[str, int, tuple[int, int]], str]:
        """``(K|V, global head, (start, end)) -> hash`` for every entry."""
        return {(KV_NAMES[kv], self.head_offset + head, self.token_range(chunk)): value
                for kv, per_head in enumerate(self.hashes)
                for head, per_chunk in enumerate(per_head)
                for chunk, value in enumerate(per_chunk)}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``json`` writes the tuples as lists)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "KVDigest":
        hashes = tuple(tuple(tuple(str(h) for h in chunks) for chunks in per_head)
                       for per_head in data["hashes"])
        return cls(int(data["head_offset"]), int(data["num_tokens"]), int(data["token_chunk"]),
                   str(data["dtype"]), hashes, int(data.get("token_offset", 0)))


def chunk_bounds(offset: int, num_tokens: int, token_chunk: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each chunk of positions ``offset .. offset + num_tokens - 1`` when
    boundaries fall on multiples of ``token_chunk``: the first chunk may be short."""
    end = offset + num_tokens
    starts = [offset] + list(range((offset // token_chunk + 1) * token_chunk, end, token_chunk))
    return [(start, min(nxt, end)) for start, nxt in zip(starts, starts[1:] + [end])]


def merge_heads(parts: Sequence[KVDigest]) -> KVDigest:
    """One layer's digest over all heads from its TP ranks' digests (any order, no gaps)."""
    ordered = sorted(parts, key=lambda part: part.head_offset)
    first, offset = ordered[0], ordered[0].head_offset
    for part in ordered:
        if (part.num_tokens, part.token_chunk, part.dtype, part.head_offset,
                part.token_offset) != (first.num_tokens, first.token_chunk, first.dtype, offset,
                                       first.token_offset):
            raise ValueError(f"TP digests differ in tokens, chunk or dtype, or heads from "
                             f"{offset} are missing or repeated")
        offset += part.num_heads
    hashes = tuple(sum((part.hashes[kv] for part in ordered), ()) for kv in range(2))
    return KVDigest(first.head_offset, first.num_tokens, first.token_chunk, first.dtype, hashes,
                    first.token_offset)


def merge_tp_ranks(ranks: Sequence[Mapping[LayerKey, KVDigest | str]]
                   ) -> dict[LayerKey, KVDigest | str]:
    """Per-layer digests of a whole TP group from each rank's. A state digest the ranks agree
    on is kept once; a sharded state's differing ones are kept per rank as ``layer@rank``."""
    merged: dict[LayerKey, KVDigest | str] = {}
    for layer in dict.fromkeys(layer for rank in ranks for layer in rank):
        values = {index: rank[layer] for index, rank in enumerate(ranks) if layer in rank}
        if all(isinstance(value, KVDigest) for value in values.values()):
            merged[layer] = merge_heads(list(values.values()))  # type: ignore[arg-type]
        elif len(set(values.values())) == 1:
            merged[layer] = next(iter(values.values()))
        else:
            merged.update((f"{layer}@{index}", value) for index, value in values.items())
    return merged


def record_line(side: str, request_id: str, *, remote_request_id: str | None, token_offset: int,
                num_tokens: int, layers: Mapping[str, Any], skipped: Mapping[str, str],
                elapsed_s: float, tp_rank: int = 0, error: str | None = None,
                raw: Mapping[str, dict] | None = None,
                host_layers: Mapping[str, Any] | None = None,
                hash_function: str = HASH_FUNCTIONS["blake2b"],
                timings: Mapping[str, float] | None = None,
                draft_layers: Iterable[str] = ()) -> str:
    """One request's digest line. ``raw``: per layer, ``{"block_tokens", "pieces"}``: hashes of
    the request's blocks' physical bytes in RAW_PIECE_TOKENS pieces, as sent (prefill) or as the
    connector wrote them, before any post-processing (decode); through a host buffer, the
    buffer's bytes. ``host_layers`` (prefill, host buffer only): the digests of the buffer the
    connector sends from. ``hash_function`` names the function every hash of the line is of
    (two sides are compared only when they name the same); ``elapsed_s`` is the digest's whole
    cost, ``timings`` its parts (COST_PARTS). ``draft_layers``: which of the layers are the
    server's speculative drafter's (a draft model's, an EAGLE head's), named only when there
    are any."""
    drafts = sorted(name for name in draft_layers if name in layers)
    return json.dumps({
        "side": side, "request_id": request_id, "remote_request_id": remote_request_id,
        "tp_rank": tp_rank, "token_offset": token_offset, "num_tokens": num_tokens,
        "hash": hash_function,
        "layers": {name: d.to_dict() for name, d in layers.items() if isinstance(d, KVDigest)},
        "states": {name: d for name, d in layers.items() if isinstance(d, str)},
        "skipped": dict(skipped),
        "raw": dict(raw or {}),
        **({"host_layers": {name: d.to_dict() for name, d in host_layers.items()
                            if isinstance(d, KVDigest)}} if host_layers else {}),
        **({"draft_layers": drafts} if drafts else {}),
        "elapsed_s": round(elapsed_s, 6),
        **{name: round(value, 6) for name, value in (timings or {}).items()},
        "error": error},
        separators=(",", ":"))


def read_digest_lines(paths: Iterable[str]) -> list[dict]:
    """Every digest line of `paths` (missing files and cut-off lines skipped)."""
    lines = []
    for path in paths:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        for raw in text.splitlines():
            try:
                lines.append(json.loads(raw))
            except json.JSONDecodeError:
                continue
    return lines


def layers_of(line: Mapping[str, Any]) -> dict[str, KVDigest | str]:
    """A line's per-layer digests: attention layers' KVDigests, recurrent layers' state hashes
    (in the model's layer order, so the first difference is the first layer's)."""
    found: dict[str, KVDigest | str] = {
        name: KVDigest.from_dict(d) for name, d in (line.get("layers") or {}).items()}
    found.update(line.get("states") or {})
    return dict(sorted(found.items(), key=lambda item: _layer_number(item[0])))


def _layer_number(name: str) -> tuple[int, str]:
    match = re.search(r"layers\.(\d+)\.", name)
    return (int(match.group(1)) if match else 10**9, name)
