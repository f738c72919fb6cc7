"""A cell's transfer evidence, read from what its P/D evaluation left on disk: the proxy's
per-request records (which kv_transfer_params prefill returned and decode received) and the
fault lines the canary plugin wrote to the decode servers' logs."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from harness.eval.metrics import TransferCounters
from harness.judge.compare import TransferProof
from harness.serve.plugins.fault_spec import APPLIED_PREFIX, parse_fault_log


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


def transfer_proof(records: list[dict], delta: TransferCounters, hybrid: bool,
                   decode_logs: Iterable[str]) -> TransferProof:
    """The TransferProof of one P/D evaluation: its proxy `records`, the decode servers'
    /metrics `delta` over it, and the fault lines in `decode_logs`."""
    def usable(params: dict | None) -> bool:
        return bool(params) and bool(params.get("remote_block_ids") is not None
                                     or params.get("remote_engine_id"))

    with_params = sum(usable(r.get("received_kv_transfer_params")) for r in records)
    sent = sum(usable(r.get("sent_kv_transfer_params")) for r in records)
    own = sum(usable(r.get("sent_kv_transfer_params"))
              and r.get("sent_kv_transfer_params") == r.get("received_kv_transfer_params")
              for r in records)
    return TransferProof(requests=len(records), requests_with_params=with_params,
                         requests_own_params=own, counters=delta,
                         recompute_allowance=1 if hybrid else 0,
                         fault_lines=count_fault_lines(
                             decode_logs, [r["request_id"] for r in records
                                           if r.get("request_id")] or None),
                         requests_sent_params=sent)


__all__ = ["count_fault_lines", "read_proxy_records", "transfer_proof"]
