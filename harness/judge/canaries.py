"""What each canary's verdict must say, and whether a canary was caught.

A canary is a cell with an injected fault (`Cell.fault`). It is CAUGHT when its verdict is FAIL
for the fault's own reason, and MISSED when it passes or fails for another reason (a harness that
fails a canary for the wrong reason would fail the real bug for the wrong reason too). A canary
whose baseline could not run is ERROR, like any other cell: nothing was tested.
"""
from __future__ import annotations

import re

from harness.core.outcomes import CAUGHT, ERROR, FAIL, MISSED

CANARY_REASONS = {
    "drop-transfer": r"decode recomputed the prompt: no KV crossed",
    "foreign-params": r"another request's transfer parameters",
    # corrupted KV is named by the digest first (it decides before accuracy); a pair run without
    # digests (--no-kv-digest) must still see it in the answers
    # under weather the per-request digest names it first: a 200 whose KV differs
    "corrupt-block": (r"\[kv-digest\]: prompt KV differs|P/D (logprobs diverge|accuracy is lower|"
                      r"generations diverge)|silent wrong answers under weather: .*its KV differs"),
    "swap-blocks": r"\[kv-digest\]: prompt KV differs|P/D (logprobs diverge|accuracy is lower|generations diverge)",
    # relative noise of 1e-3 on every received value: only the digest can see it
    "perturb-kv": r"\[kv-digest\]: prompt KV differs",
    # a read reported failed must reach the verdict as a failure: vLLM's error answer
    # (kv_load_failure_policy "fail": finish_reason "error", HTTP 500; lm-eval's RequestsFailed)
    # or the connector's failed-transfer counter (any policy; "recompute" answers correctly) — never an
    # accuracy drop, never a silent success
    "fail-transfer": (r"transfer proof failed \[no-failed-transfers\]|P/D evaluation failed: "
                      r"RequestsFailed: requests failed on \d+ of \d+ questions: "
                      r".*(HTTP 500|finish_reason \"error\")"),
    # the prefill frees a request's blocks a fraction of a second after its prefill: only a
    # read that comes late (weather: load) finds them recycled: a 200 whose KV is not its
    # prefill's, named per request (or, loudly, a failure no weather event explains)
    # the decode's drafts replaced, its KV and answers untouched: acceptance alone can see it
    "wrong-drafts": r"P/D's drafts are accepted less than the baseline's \[spec-acceptance\]",
    # the draft's received KV zeroed: the digest names a draft layer first (a draft model's
    # draft_model.*, or a layer its servers named the draft's: an EAGLE head's); without the
    # digest (--no-kv-digest) the acceptance must see it
    "corrupt-draft-kv": (r"\[kv-digest\]: prompt KV differs.*first at layer "
                         r"(draft_model\.|\S+ \(the draft's\))|"
                         r"P/D's drafts are accepted less than the baseline's \[spec-acceptance\]"),
    "early-release": (r"silent wrong answers under weather|"
                      r"P/D failed under weather beyond what was injected"),
    # the proxy routes every request to the first prefill and the first decode
    "idle-instance": r"an instance of the pair served no request",
}


def caught_for_its_reason(fault: str, status: str, reason: str) -> bool:
    pattern = CANARY_REASONS.get(fault)
    return status == FAIL and pattern is not None and re.search(pattern, reason) is not None


def canary_outcome(fault: str, status: str, reason: str) -> str:
    if status == ERROR:
        return ERROR
    return CAUGHT if caught_for_its_reason(fault, status, reason) else MISSED
