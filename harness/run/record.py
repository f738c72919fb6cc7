"""Record: the one JSON file a cell's run leaves behind, written atomically.

Schema (version 1) — every key is always present; unknown values are null:

    {
      "schema_version": 1,
      "run_id": "20261129T193000Z-ab12cd",      # one per harness invocation
      "created_at": "2026-11-29T19:31:02Z",
      "cell": {... Cell.to_dict(), "id": "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1"},
      "versions": {"vllm": "0.32.0", "nixl": "1.5.1", "lm_eval": "0.4.13", "torch": "2.13.0+cpu",
                   "harness": "<git sha or version>", "python": "3.11.7"},
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
        "transfer": {                                # decode /metrics deltas + proxy records
          "requests": 50, "requests_with_params": 50,
          "prompt_tokens_external": 15000, "prompt_tokens_local": 0,
          "prompt_tokens_total": 15000,
          "nixl_bytes": 123456, "nixl_failed_transfers": 0, "nixl_failed_notifications": 0
        }
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
        ...} | null                                  # log (harness.serve.launch.effective_config)
    }

`effective_config` is written by every run since it was added; older records lack it (readers
treat it as null), so it is not in RECORD_KEYS.

Paths in "artifacts" are relative to the record's own directory when they lie below it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from harness.core.atomic import atomic_write_json

SCHEMA_VERSION = 1
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


def write_record(results_dir: str | os.PathLike[str], record: Mapping[str, Any]) -> Path:
    validate_record(record)
    name = f"{record['cell']['id']}.json"
    return atomic_write_json(Path(results_dir) / record["run_id"] / name, record)


def load_records(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record JSON below `root` (recursively), oldest run first."""
    out = []
    for p in sorted(Path(root).rglob("*.json")):
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and data.get("schema_version") == SCHEMA_VERSION and "verdict" in data:
            data.setdefault("_path", str(p))
            out.append(data)
    out.sort(key=lambda r: (r.get("created_at") or "", r["cell"].get("id", "")))
    return out
