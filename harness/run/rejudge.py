"""Re-judging a committed record offline: today's judge on the evidence its run left.

A record keeps its comparison's numbers (metrics), the proxy's per-request records and the
server logs (gzipped once committed: results/reference/*). Re-judging rebuilds the transfer proof
from those files with today's KV geometry and byte account
(harness.run.evidence.transfer_evidence), puts it in the recorded comparison and decides again
(harness.judge.verdict.decide), so a fix of the judge's expectation is tried on the evidence that
showed the fault, with no server started.

Taken as recorded, because their sources are gone: the connector's counters (a /metrics delta of
servers long stopped), the KV digest evidence and the network link (their files are not kept),
and the comparison's numbers (the A/A re-run's samples are not kept). The reference accuracy is
the model card's for the task an offline host picks. Not re-judged (ValueError, saying why): a
weather cell (judged per request from files a record does not keep), an external deployment, a
record decided before its P/D evaluation, one whose proxy records were pruned. A record decided
under an older rule may come out CONTINUE: today's plan would have asked more questions.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from harness.core.cell import Cell
from harness.core.spec_decode import PREFILL_SPEC_TOKENS
from harness.weathers import DEFAULT_WEATHER
from harness.eval.metrics import TransferCounters
from harness.judge import spec_acceptance, stats
from harness.judge.compare import Comparison, TransferProof
from harness.judge.verdict import Policy, Verdict, as_declared, decide
from harness.run.record import upgrade_record
from harness.run.evidence.transfer_evidence import ByteGeometry, read_proxy_records, transfer_proof


@dataclass(frozen=True)
class Rejudged:
    record: dict             # the record as committed
    comparison: Comparison   # its comparison with the transfer proof rebuilt
    verdict: Verdict         # today's verdict of it (the cell's canary/expected failure applied)


def _artifact(run_dir: Path, path: str | None, into: Path) -> str | None:
    """`path` (as the record names it: relative to its run directory) as a plain file in `into`
    (a committed .gz copy unpacked); None when neither copy is there."""
    if not path:
        return None
    for candidate in (run_dir / path, Path(path)):
        for found in (candidate, candidate.with_name(candidate.name + ".gz")):
            if found.is_file():
                out = into / f"{len(list(into.iterdir()))}-{candidate.name}"
                opener = gzip.open if found.suffix == ".gz" else open
                with opener(found, "rb") as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                return str(out)
    return None


def _counters(transfer: Mapping[str, Any]) -> TransferCounters:
    names = {f.name for f in dataclasses.fields(TransferCounters)}
    return TransferCounters(**{k: float(v) for k, v in transfer.items() if k in names})


def _comparison(metrics: Mapping[str, Any], proof: TransferProof) -> Comparison:
    """The recorded comparison (Comparison.metrics_dict read back) with `proof` as its transfer."""
    floor = metrics.get("noise_floor")
    floor_fields = {f.name for f in dataclasses.fields(stats.FloorTest)}
    discordant = metrics["discordant"]
    return Comparison(
        n=metrics["n"], unpaired=metrics["unpaired"],
        baseline_accuracy=metrics["baseline_accuracy"], pd_accuracy=metrics["pd_accuracy"],
        accuracy_delta=metrics["accuracy_delta"],
        delta_ci=stats.DeltaCI(**metrics["delta_ci_detail"]),
        mcnemar=stats.mcnemar_worse(discordant["baseline_only"], discordant["pd_only"]),
        base_discordance=metrics["base_discordance"],
        mde=math.inf if metrics.get("mde") is None else metrics["mde"],
        generations_differing=metrics["generations_differing"], agreement=metrics["agreement"],
        floor=stats.FloorTest(**{k: v for k, v in floor.items() if k in floor_fields}) if floor else None,
        logprob=metrics.get("logprob"), logprob_floor=metrics.get("logprob_floor"),
        transfer=proof, alpha=metrics["alpha"], examples=tuple(metrics.get("examples") or ()),
        consistency=metrics.get("consistency"),
        **_spec(metrics))


def _spec(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The recorded draft acceptance, question by question, or why it cannot be judged again."""
    kept = metrics.get("spec_acceptance")
    spec = spec_acceptance.SpecEvidence.from_summary(kept)
    skipped = metrics.get("spec_acceptance_skipped")
    if kept and spec is None:
        skipped = "the record keeps its acceptance summed only, not per question"
    return {"spec": spec, "spec_skipped": skipped}


def _reference(cell: Cell, options: Mapping[str, Any]):
    from harness.eval.task_choice import choose_task
    from harness.serve.launch.models import reference_accuracy, resolve

    model = resolve(cell.model)
    task = options.get("task") or "auto"
    if task == "auto":
        task = choose_task(model, prefix_reuse=cell.prefix_reuse, hub=lambda: False).task
    return reference_accuracy(model, task), model


def rejudge(record_path: str | Path) -> Rejudged:
    """Today's verdict of the record at `record_path` (its files beside it, see the module)."""
    record_path = Path(record_path)
    record = upgrade_record(json.loads(record_path.read_text()))
    name = record["cell"].get("id")
    if record["cell"].get("external"):
        raise ValueError(f"{name}: an external deployment's record (its router keeps no proxy "
                         f"records of the harness's): not re-judged offline")
    cell = Cell.from_dict(record["cell"])
    if cell.weather != DEFAULT_WEATHER:
        raise ValueError(f"{name}: a weather cell is judged per request, from files a record "
                         f"does not keep: not re-judged offline")
    metrics, options = record["metrics"], record["options"]
    transfer = metrics.get("transfer")
    if not transfer:
        raise ValueError(f"{name}: no transfer proof recorded (decided before its P/D "
                         f"evaluation: {record['verdict']['reason'][:120]}): nothing to re-judge")
    reference, model = _reference(cell, options)
    draft = None
    if cell.spec_decode in PREFILL_SPEC_TOKENS:   # a draft on both sides: its layers cross too
        from harness.serve.launch.server_spec import draft_checkpoint

        draft = draft_checkpoint(cell.spec_decode, "prefill", model.path)
    # the decode reads the prefill's blocks: their dtype is the prefill's KV cache dtype
    geometry = ByteGeometry.of_pair(model.path, cell.dtype, cell.prefill_block_size,
                                    cell.extra_args, cell.prefill_kv_cache_dtype, draft)
    artifacts = record.get("artifacts") or {}
    with tempfile.TemporaryDirectory(prefix="pd-rejudge-") as tmp:
        into = Path(tmp)
        records_file = _artifact(record_path.parent, artifacts.get("proxy_records"), into)
        if records_file is None:
            raise ValueError(f"{cell.cell_id}: its proxy records "
                             f"({artifacts.get('proxy_records')}) are not beside the record")
        logs = artifacts.get("logs") or {}
        decode_logs = [f for role, p in sorted(logs.items()) if role.startswith("decode")
                       if (f := _artifact(record_path.parent, p, into))]
        proof = transfer_proof(read_proxy_records(records_file), _counters(transfer),
                               hybrid=bool(transfer.get("recompute_allowance")),
                               decode_logs=decode_logs, geometry=geometry, link=transfer.get("link"))
    # the requests per instance are taken as recorded: the pair's list of instances is gone
    proof = dataclasses.replace(proof, kv_digest=transfer.get("kv_digest"),
                                kv_digest_skipped=transfer.get("kv_digest_skipped"),
                                instances=transfer.get("instances"))
    cmp = _comparison(metrics, proof)
    looks = (metrics.get("sequential") or {}).get("looks") or []
    known = {f.name for f in dataclasses.fields(Policy)}   # older records name retired fields
    policy_opts = {k: v for k, v in (options.get("policy") or {}).items() if k in known}
    policy = Policy(**{**policy_opts, "stages": tuple(policy_opts.get("stages") or Policy.stages)})
    verdict = decide(cmp, policy, cell.expected_failure, reference=reference,
                     previous_n=looks[-2]["n"] if len(looks) >= 2 else None,
                     random_weights=model.random_weights)
    return Rejudged(record, cmp, as_declared(verdict, cell))


__all__ = ["Rejudged", "rejudge"]
