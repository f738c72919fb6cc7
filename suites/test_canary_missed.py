"""A canary whose fault does nothing must be reported as MISSED (exit 1), never as green: the
harness is blind to it. Real servers: a corrupt-block canary aimed at block 99 of prompts that
have 4 blocks is skipped by the decode's fault plugin on every request."""
from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_a_canary_whose_fault_does_nothing_is_missed(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "harness.cli.main", "run", "--model", "tiny-llama-gsm",
         "--compile", "eager", "--fault", "corrupt-block", "--fault-block", "99",
         "--limit", "20", "--max-questions", "20", "--no-noise-floor",
         "--results-dir", str(tmp_path / "results")],
        capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert "canary missed: v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-fault-corrupt-block-99" \
        in out, out[-3000:]
    assert "1 cell: 1 canary missed" in out, out[-3000:]
    assert "pd-accuracy fault-skipped:" in "".join(
        p.read_text() for p in (tmp_path / "results").rglob("*decode-0.log"))
