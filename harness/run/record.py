"""Record: the one JSON file a cell's run leaves behind, written atomically.

Schema (version 3) — every key is always present; unknown values are null:

    {
      "schema_version": 3,
      "run_id": "20261129T193000Z-ab12cd",      # one per harness invocation
      "created_at": "2026-11-29T19:31:02Z",
      "cell": {... Cell.to_dict() (kv_connector included), "id": "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1"},
      "versions": {"vllm": "0.32.0", "<transport>": "1.5.1", "lm_eval": "0.4.13",
                   "torch": "2.13.0+cpu", "harness": "<git sha or version>", "python": "3.11.7"},
                  # the connector's transport under its distribution's name (its row's first
                  # distributions; none for a connector that is vLLM's own code)
      "hardware": {"platform": "cpu"|"cuda", "cpu": "...", "cpu_isa": ["avx2", ...],
                   "cpu_count": 2, "gpus": ["NVIDIA H200"], "hostname": "..."},
      "options": {... RunOptions as dict},
      "metrics": {
        "n": 50,
        "baseline_accuracy": 0.94, "pd_accuracy": 0.94,
        "accuracy_delta": 0.0,                       # pd - baseline
        "delta_ci": [-0.04, 0.04],                   # paired bootstrap CI of the delta
        "mcnemar_p": 1.0,                            # one-sided, "P/D is worse"
        "discordant": {"baseline_only": 0, "pd_only": 0},
        "mde": 0.12,                                 # minimum detectable drop at 80% power
        "agreement": 0.98,                           # exact generation agreement
        "noise_floor": {...} | null,                 # A/A disagreement, when measured
        "logprob": {...} | null,                     # |Δ logprob| summary, when measured
        "transfer": {                                # the pair's /metrics deltas + proxy records
          "requests": 50, "requests_with_params": 50,
          "prompt_tokens_external": 15000, "prompt_tokens_local": 0,
          "prompt_tokens_total": 15000,
          "kv_bytes": 123456, "kv_transfers": 50, "failed_transfers": 0,
          "failed_notifications": 0, "expired_requests": 0
        },
        "weather": {...} | absent                    # a weather cell's rows, events and checks;
                                                     # "series": its request series' windows
      },
      "verdict": {"status": "PASS"|"FAIL"|"INCONCLUSIVE"|"ERROR",
                  "reason": "one line",
                  "expected_failure": null | "reason",
                  "outcome": "PASS"|"FAIL"|"INCONCLUSIVE"|"ERROR"|"XFAIL"|"XPASS",
                  "checks": [{"name": "transfer", "passed": true, "detail": "..."}, ...]},
      "timings": {"startup_s": 31.2, "baseline_eval_s": 20.1, "pd_eval_s": 25.3, "total_s": 80.0},
      "artifacts": {"baseline_samples": "path.jsonl", "pd_samples": "path.jsonl",
                    "logs": {"baseline": "...log", "prefill-0": "...", "decode-0": "...",
                             "proxy": "..."},
                    "proxy_records": "path.jsonl"},
      "effective_config": {                          # what each server really ran, from its
        "decode-0": {"role": "decode-0", "block_size": 128, "attention_backend": "CPU_ATTN",
                     "kv_cache_dtype": "bfloat16", "kv_cache_layout": "LBHNC", "runner": "v1",
                     ..., "sources": {"block_size": "log: ..."}, "not_exposed": {...}},
        ...} | null                                  # log (harness.protocol.effective_config)
    }

`effective_config` is written by every run since it was added; older records lack it (readers
treat it as null), so it is not in RECORD_KEYS.

Paths in "artifacts" are relative to the record's own directory when they lie below it.

Version 1 (before the connector seam) named the transfer counters and the byte check after its
only connector; version 2 named a weather's request series after the one weather that sent one
then. `load_records` reads both with today's names (harness.core.old_records).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from harness.core.atomic import atomic_write_json
from harness.core.redact import redact_data
from harness.core.safe_paths import under
from harness.core.old_records import with_todays_names
from harness.core.cell import Cell
from harness.core.options import RunOptions
from harness.run.evidence.provenance import hardware, versions
from harness.serve.supervision.registry import raise_if_interrupted

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
RECORD_KEYS = (
    "schema_version", "run_id", "created_at", "cell", "versions", "hardware", "options",
    "metrics", "verdict", "timings", "artifacts",
)


def validate_record(record: Mapping[str, Any]) -> None:
    missing = [k for k in RECORD_KEYS if k not in record]
    if missing:
        raise ValueError(f"record lacks keys: {', '.join(missing)}")
    if record["schema_version"] != SCHEMA_VERSION:
        raise ValueError(f"record schema_version {record['schema_version']} != {SCHEMA_VERSION}")


def upgrade_record(data: dict[str, Any]) -> dict[str, Any]:
    """A record of any readable version with today's names (schema_version left as written)."""
    if data.get("schema_version") == SCHEMA_VERSION:
        return data
    return with_todays_names(data)


def write_record(results_dir: str | os.PathLike[str], record: Mapping[str, Any]) -> Path:
    """Write `record` (redacted: harness.core.redact) as <results_dir>/<run_id>/<cell id>.json;
    ValueError when the path would leave `results_dir`."""
    validate_record(record)
    name = f"{record['cell']['id']}.json"
    path = under(results_dir, record["run_id"], name)
    return atomic_write_json(path, redact_data(dict(record)))


NOT_APPLICABLE_FILE = "not_applicable.json"
NOT_APPLICABLE_OUTCOME = "N/A"


def write_not_applicable(run_dir: Path, run_id: str, cells: Sequence[Any]) -> Path:
    """The run's cells that its vLLM release cannot run (matrix.NotApplicable), beside the
    records: never started, each with the reason, so a release x cell view can show them."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {"run_id": run_id, "created_at": now,
            "cells": [{"cell": {**c.cell.to_dict(), "id": c.cell.cell_id}, "rule": c.rule,
                       "reason": c.reason, "vllm": c.vllm_version} for c in cells]}
    path = Path(run_dir) / NOT_APPLICABLE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, body)
    return path


def load_not_applicable(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every run's not-applicable cells below `root`, as record-shaped rows (outcome "N/A")."""
    out = []
    for p in sorted(Path(root).rglob(NOT_APPLICABLE_FILE)):
        try:
            body = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        for entry in body.get("cells") or ():
            out.append({"run_id": body.get("run_id"), "created_at": body.get("created_at"),
                        "cell": entry.get("cell") or {}, "versions": {"vllm": entry.get("vllm")},
                        "verdict": {"status": NOT_APPLICABLE_OUTCOME,
                                    "outcome": NOT_APPLICABLE_OUTCOME,
                                    "reason": entry.get("reason")}})
    return out


def load_records(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record JSON below `root` (recursively), oldest run first."""
    out = []
    for p in sorted(Path(root).rglob("*.json")):
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and data.get("schema_version") in READABLE_VERSIONS and "verdict" in data:
            data.setdefault("_path", str(p))
            out.append(upgrade_record(data))
    out.sort(key=lambda r: (r.get("created_at") or "", r["cell"].get("id", "")))
    return out


class DecidedVerdict(Protocol):
    """A cell's verdict once judged (harness.judge.verdict.Verdict): what a record stores and a
    run's result reads."""

    status: str
    reason: str
    not_available: tuple[str, ...]

    @property
    def outcome(self) -> str: ...

    @property
    def exit_code(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    verdict: DecidedVerdict
    record_path: Path | None
    record: dict


@dataclass(frozen=True)
class Recorder:
    """Writes each cell's record of one run, with the verdict it is given (judged already:
    harness.run.evidence.effective_config_evidence.record_judged), and says it on `progress`."""

    options: RunOptions
    policy: Mapping[str, Any]      # the judge's policy, as the record's options store it
    run_id: str
    results_root: Path
    progress: Callable[[str], None]

    def record(self, cell: Cell, verdict: DecidedVerdict, *, metrics: dict | None = None,
               timings: dict | None = None, artifacts: dict | None = None,
               run_id: str | None = None, effective_config: dict | None = None) -> CellResult:
        """Write `cell`'s record: `verdict` as given, `effective_config` what its servers ran."""
        # no verdict after a stop signal: what failed then is the interruption, not the cell
        raise_if_interrupted()
        run_id = run_id or self.run_id
        record = {
            "schema_version": SCHEMA_VERSION,
            "run_id": run_id,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cell": cell.to_dict(),
            "versions": versions(cell.kv_connector),
            "hardware": hardware(cell.device),
            "options": {**self.options.to_dict(), "policy": dict(self.policy)},
            "metrics": metrics or {},
            "verdict": verdict.to_dict(),
            "timings": timings or {}, "effective_config": effective_config,
            "artifacts": relative_paths(artifacts or {}, self.results_root / run_id),
        }
        path = write_record(self.results_root, record)
        self.progress(f"{verdict.outcome:<12} {cell.cell_id}: {verdict.reason}")
        return CellResult(cell, verdict, path, record)


def relative_paths(artifacts: dict, run_dir: Path) -> dict:
    """`artifacts` with every absolute path made relative to `run_dir`."""
    def rel(v: object) -> object:
        if isinstance(v, dict):
            return {k: rel(x) for k, x in v.items()}
        if isinstance(v, str) and os.path.isabs(v):
            return os.path.relpath(v, run_dir)
        return v
    return rel(artifacts)
