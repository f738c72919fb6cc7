"""A cell's transfer evidence, read from what its P/D evaluation left on disk: the proxy's
per-request records (which kv_transfer_params prefill returned and decode received, read through
the pair's connector, harness.connectors), the pair's transfer counters, and the
fault lines the canary plugin wrote to the decode servers' logs; for a network: netns pair, the
bytes its decode's P<->D link received (harness.serve.net.netns) and the UCX settings its servers
ran with."""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from harness.core.kv_geometry import (GeometryUnknown, KvGeometry, draft_geometry,
                                      geometry_from_config, with_draft)
from harness.judge.byte_accounting import account

from harness.connectors import DEFAULT_KV_CONNECTOR, connector_for, connector_row
from harness.eval.metrics import TransferCounters, scrape, scrape_pair
from harness.judge.compare import TransferProof
from harness.run.evidence.kv_digest_evidence import digest_evidence
from harness.connectors.driver import PAIR_ROLES, KvConnector
from harness.serve.deploy import Deployment
from harness.protocol.effective_config import FORCED_BLOCK_RE
from harness.serve.net.netns import process_env
from harness.serve.proxy.hops import answer_of
from harness.protocol.faults import APPLIED_PREFIX, parse_fault_log


def read_proxy_records(path: str | None) -> list[dict]:
    """The proxy's JSON-lines records; blank and unreadable lines (a record cut off when the
    proxy stopped) are skipped, a missing file gives []."""
    if not path or not Path(path).exists():
        return []
    out = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def count_fault_lines(log_paths: Iterable[str], request_ids: Iterable[str] | None = None) -> int:
    """How many faults the canary plugin applied, summed over `log_paths` (missing logs count 0);
    with `request_ids`, only those applied to these requests (a pair's decode log also holds the
    lines of the other cells it served: vLLM's own request id contains the proxy's)."""
    wanted = None if request_ids is None else [r for r in request_ids if r]
    n = 0
    for p in log_paths:
        try:
            text = Path(p).read_text(errors="replace")
        except OSError:
            continue
        if wanted is None:
            n += text.count(APPLIED_PREFIX)
            continue
        for line in parse_fault_log(text):
            n += line.applied and any(r in line.request_id for r in wanted)
    return n


# vLLM (0.26 GPU, 0.32 CPU) logs each hybrid decode worker's per-layer recurrent state bytes when
# it registers its caches with its connector (the connector's words): "Hybrid SSM registration: ... mamba_ssm_size=(3264, 32768)"
_STATE_SIZE_RE = re.compile(r"mamba_ssm_size=\((\d+),\s*(\d+)\)")


def _first_match(logs: Iterable[str], pattern: re.Pattern) -> re.Match | None:
    """`pattern`'s first match in the first of `logs` that has one (unreadable logs skipped)."""
    for p in logs:
        try:
            m = pattern.search(Path(p).read_text(errors="replace"))
        except OSError:
            continue
        if m:
            return m
    return None


def forced_block_size_from_logs(logs: Iterable[str]) -> int | None:
    """The block size vLLM forced on a server against the one asked for (vLLM 0.32's CPU MLA
    backend: "requires block_size=16, overriding user-specified block_size=128")."""
    m = _first_match(logs, FORCED_BLOCK_RE)
    return int(m.group(1)) if m else None


def state_bytes_from_logs(decode_logs: Iterable[str]) -> int | None:
    """Bytes of one recurrent layer's state (conv + SSM) as the decode server logged them."""
    m = _first_match(decode_logs, _STATE_SIZE_RE)
    return int(m.group(1)) + int(m.group(2)) if m else None


class ByteGeometry:
    """What exact byte accounting needs of a pair: the model's KV geometry, the prefill block
    size, and (hybrids) the state bytes the decode logged; or why it cannot be computed."""

    def __init__(self, geometry: KvGeometry | None, prefill_block_size: int,
                 skipped: str | None = None) -> None:
        self.geometry, self.prefill_block_size, self.skipped = geometry, prefill_block_size, skipped

    @classmethod
    def of_pair(cls, model_path: str, dtype: str, prefill_block_size: int,
                extra_args: tuple[str, ...] = (), kv_cache_dtype: str = "auto",
                draft_model_path: str | None = None) -> "ByteGeometry":
        """``draft_model_path``: the draft model both sides run (its layers' KV crosses too);
        for an MTP head, the served checkpoint itself (its MTP layers)."""
        try:
            config = json.loads((Path(model_path) / "config.json").read_text())
            geometry = geometry_from_config(config, dtype, extra_args, kv_cache_dtype)
            if draft_model_path:
                draft = json.loads((Path(draft_model_path) / "config.json").read_text())
                geometry = with_draft(geometry, draft_geometry(draft, dtype, extra_args,
                                                               kv_cache_dtype))
            return cls(geometry, prefill_block_size)
        except (OSError, json.JSONDecodeError) as exc:
            return cls(None, prefill_block_size, f"model config not readable: {exc}")
        except GeometryUnknown as exc:
            return cls(None, prefill_block_size, str(exc))


def record_connector(record: dict) -> KvConnector:
    """The connector whose params a proxy record carries (records before the seam: the default)."""
    return connector_for(record.get("kv_connector") or DEFAULT_KV_CONNECTOR)


def pair_counters(pair: Deployment) -> TransferCounters:
    """The pair's transfer counters now: each role's /metrics read through its connector's map
    (a pull connector's decode counts the transfers, a push connector's prefill)."""
    connector = connector_for(pair.specs[-1].kv_connector)
    return scrape_pair({role: pair.urls(role) for role in PAIR_ROLES}, connector.metrics)


# a pair's servers of one role, each as (name, base URL): "decode-1", "http://127.0.0.1:8200"
Instances = Mapping[str, Sequence[tuple[str, str]]]


def pair_instances(pair: Deployment) -> dict[str, list[tuple[str, str]]]:
    """Every P/D server of `pair`, by role, as (name, base URL)."""
    return {role: [(s.name, s.base_url) for s in pair.specs if s.role == role]
            for role in PAIR_ROLES}


def several(instances: Instances | None) -> bool:
    """Whether a role of the pair has more than one instance (1P2D, 2P1D, ...)."""
    return bool(instances) and any(len(named) > 1 for named in instances.values())


def decode_instance_counters(pair: Deployment) -> dict[str, TransferCounters]:
    """Each decode instance's own counters now (base URL -> counters), for a pair of several
    instances; {} for one decode (the pair's counters say it all)."""
    instances = pair_instances(pair)
    if not several(instances):
        return {}
    connector = connector_for(pair.specs[-1].kv_connector)
    return {url: scrape(url, counters=connector.metrics) for _, url in instances["decode"]}


def instance_counts(records: list[dict], instances: Instances | None,
                    decode_delta: Mapping[str, TransferCounters] | None = None) -> dict | None:
    """Per role, each instance of the pair and the proxy's requests routed to it (and a decode
    instance's prompt tokens that arrived through the connector); None for a pair of one
    prefill and one decode, where every request meets both."""
    if not several(instances):
        return None
    out: dict[str, list[dict]] = {}
    for role, named in (instances or {}).items():
        routed = Counter(str(r.get(f"{role}_url") or "").rstrip("/") for r in records)
        out[role] = [{"name": name, "url": url, "requests": routed.get(url.rstrip("/"), 0)}
                     for name, url in named]
        for row in out[role]:
            if role == "decode" and decode_delta and row["url"] in decode_delta:
                row["external_tokens"] = decode_delta[row["url"]].prompt_tokens_external
    return out


def _byte_account(records: list[dict], delta: TransferCounters, geometry: ByteGeometry | None,
                  decode_logs: list[str]) -> tuple[dict | None, str | None]:
    if any(record_connector(r).byte_accounting is None for r in records):
        return None, "the connector cannot say how many bytes it should move"
    if geometry is None:
        return None, "no geometry given (not a harness-started pair)"
    if geometry.geometry is None:
        return None, geometry.skipped
    state = 0
    if geometry.geometry.state_layers:
        logged = state_bytes_from_logs(decode_logs)
        if logged is None:
            return None, "hybrid: the decode log has no 'mamba_ssm_size' line to size its state"
        state = logged
    # the blocks each request's transfer was to move, as its connector lists them (pull: what the
    # decode was sent, a foreign-params canary's another request's; a dropped transfer: none)
    block_size = geometry.prefill_block_size
    if geometry.geometry.latent:    # every MLA server gets the block size its backend forces
        block_size = forced_block_size_from_logs(decode_logs) or block_size
    blocks = (record_connector(r).block_params(r.get("received_kv_transfer_params"),
                                               r.get("sent_kv_transfer_params")) for r in records)
    try:
        acc = account(blocks, geometry.geometry, block_size, delta.kv_bytes,
                      state_bytes_per_layer=state, cache_hit_tokens=delta.prompt_tokens_cache_hit)
    except GeometryUnknown as exc:
        return None, str(exc)
    return acc.to_dict(), None


def link_start(pair: Deployment) -> tuple[int, int] | None:
    """A netns pair's decode P<->D link counters (rx, tx) before an evaluation; None else."""
    return None if pair.topology is None else pair.topology.link_bytes("decode")


def link_evidence(pair: Deployment, before: tuple[int, int] | None) -> dict | None:
    """A netns pair's link evidence since `before` (TransferProof.link); None for one host."""
    if pair.topology is None:
        return None
    ucx = {name: process_env(proc.pid) for name, proc in sorted(pair.processes.items())}
    return pair.topology.evidence(before, ucx)


class DigestFiles:
    """Where a pair's servers wrote their KV digests, and the decode's block size (to name the
    first differing block); or why there are none."""

    def __init__(self, prefill: list[str], decode: list[str], decode_block_size: int,
                 skipped: str | None = None) -> None:
        self.prefill, self.decode, self.decode_block_size = prefill, decode, decode_block_size
        self.skipped = skipped

    @classmethod
    def of_pair(cls, pair: Deployment) -> "DigestFiles":
        decode = next(s for s in pair.specs if s.role == "decode")
        if not pair.kv_digest:
            return cls([], [], decode.block_size, "KV digests off (--no-kv-digest)")
        connector = connector_for(decode.kv_connector)
        if not connector.kv_digest:
            return cls([], [], decode.block_size, f"the kv-digest plugin does not hook "
                                                  f"{connector.vllm_name}")
        return cls(pair.digest_files("prefill"), pair.digest_files("decode"), decode.block_size)


def transfer_proof(records: list[dict], delta: TransferCounters, hybrid: bool,
                   decode_logs: Iterable[str], geometry: ByteGeometry | None = None,
                   link: dict | None = None, digests: DigestFiles | None = None,
                   instances: dict | None = None) -> TransferProof:
    """The TransferProof of one P/D evaluation: its proxy `records`, the pair's transfer
    counters' `delta` over it, the fault lines in `decode_logs`, (with `geometry`) the exact
    byte account, (netns pairs) the `link` evidence, (with `digests`) the KV digests and (a
    pair of several instances) the requests each instance served (`instance_counts`)."""
    decode_logs = list(decode_logs)
    def usable(params: dict | None) -> bool:
        return bool(params) and bool(params.get("remote_block_ids") is not None
                                     or params.get("remote_engine_id"))

    # a connector whose prefill answers no params: the handle the proxy named once
    # the prefill answered, counted as that prefill's params (TransferProof.params_named_by_proxy)
    with_params = sum(usable(answer_of(r)) for r in records)
    named = sum(bool(r.get("kv_transfer_handle")) for r in records)
    sent = sum(usable(r.get("sent_kv_transfer_params")) for r in records)
    byte_account, skipped = _byte_account(records, delta, geometry, decode_logs)
    own = sum(usable(r.get("sent_kv_transfer_params"))
              and r.get("sent_kv_transfer_params")
              == record_connector(r).decode_params(answer_of(r))
              for r in records)
    return TransferProof(requests=len(records), requests_with_params=with_params,
                         requests_own_params=own, counters=delta,
                         recompute_allowance=1 if hybrid else 0,
                         fault_lines=count_fault_lines(
                             decode_logs, [r["request_id"] for r in records
                                           if r.get("request_id")] or None),
                         requests_sent_params=sent,
                         byte_account=byte_account, byte_account_skipped=skipped, link=link,
                         params_named_by_proxy=named,
                         kv_bytes_counted=all("kv_bytes" in record_connector(r).metrics.samples
                                              .values() for r in records),
                         instances=instances,
                         sequences=sum(int(r.get("n") or 1) for r in records),
                         **_digest_fields(records, digests))


def _digest_fields(records: list[dict], digests: DigestFiles | None) -> dict:
    if digests is None:
        return {"kv_digest_skipped": "servers not started by the harness: no digest plugin"}
    if digests.skipped:
        return {"kv_digest_skipped": digests.skipped}
    word = connector_row(record_connector(records[0]).value).word if records else "the connector"
    return {"kv_digest": digest_evidence(records, digests.prefill, digests.decode,
                                         digests.decode_block_size, word)}


__all__ = ["ByteGeometry", "DigestFiles", "count_fault_lines", "decode_instance_counters",
           "instance_counts", "link_evidence", "link_start", "pair_counters", "pair_instances", "read_proxy_records", "record_connector", "state_bytes_from_logs",
           "transfer_proof"]
