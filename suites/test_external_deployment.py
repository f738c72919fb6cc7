"""A deployment the harness did not start, judged like a cell (real servers). A separate process
(scripts/deploy_for_external.py) brings up the smoke dense cell's baseline and P/D pair
(tiny-llama-gsm, CPU_ATTN, block 128, eager; 3 vLLM servers) with the harness's own deploy
code, plus harness proxies playing the user's router; `pd-accuracy run --deployment FILE` runs
in another process against each deployment file it wrote:

* router: harness-proxy over the prefill and decode servers: PASS, every transfer check run;
* the clean user router: PASS, the proxy-only checks listed as not available;
* a router that drops the transfer: FAIL, decode recomputed the prompt (from /metrics alone);
* a router whose requests get block 2 of their KV zeroed on the armed decode: FAIL on accuracy,
  generations or logprobs.

The deploy process is stopped (SIGTERM: it stops every server it started) on every exit path.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.judge.canaries import CANARY_REASONS
from harness.run.deployment_file import PROXY_ONLY_CHECKS
from harness.protocol.faults import APPLIED_PREFIX

pytestmark = [pytest.mark.slow, pytest.mark.extended]

REPO = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 1200     # three servers starting together on a loaded 2-core machine: <= 7 min
RUN_TIMEOUT_S = 1800


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """ready.json of a running deployment (scripts/deploy_for_external.py)."""
    out = tmp_path_factory.mktemp("external-deployment")
    log = open(out / "deploy.log", "w")
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "deploy_for_external.py"),
                             "--out", str(out)], cwd=REPO, stdin=subprocess.PIPE, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not (out / "ready.json").exists():
            if proc.poll() is not None:
                pytest.fail(f"deploy script exited {proc.returncode}: "
                            f"{(out / 'deploy.log').read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"deployment not ready in {READY_TIMEOUT_S} s: "
                            f"{(out / 'deploy.log').read_text()[-3000:]}")
            time.sleep(1.0)
        yield json.loads((out / "ready.json").read_text())
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)   # its handler stops every managed process
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)   # its own session: our child's group only
                proc.wait(timeout=30)
        if proc.stdin:
            proc.stdin.close()
        log.close()


def judge(deployment: dict, name: str, results: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """`pd-accuracy run --deployment <name>.yaml --limit 50` in its own process, and its record."""
    run = subprocess.run([sys.executable, "-m", "harness.cli.main", "run", "--deployment",
                          deployment["files"][name], "--limit", "50", "--results-dir", str(results)],
                         cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    out = run.stdout + run.stderr
    records = list(results.glob(f"*/external-smoke-{name}.json"))
    assert len(records) == 1, out[-3000:]
    return run, json.loads(records[0].read_text())


def test_harness_proxy_in_front_of_the_servers_passes_with_every_check(deployment, tmp_path):
    run, record = judge(deployment, "harness-proxy", tmp_path / "results")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert record["verdict"]["outcome"] == "PASS", record["verdict"]["reason"]
    checks = {c["name"]: c["passed"] for c in record["verdict"]["checks"]}
    assert set(PROXY_ONLY_CHECKS) <= set(checks) and all(checks.values()), checks
    assert record["verdict"]["not_available"] == []
    assert record["metrics"]["transfer"]["prompt_tokens_external"] > 0
    assert record["metrics"]["transfer"]["requests"] >= record["metrics"]["n"]


def test_a_user_router_passes_and_says_what_it_could_not_check(deployment, tmp_path):
    run, record = judge(deployment, "router", tmp_path / "results")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert record["verdict"]["outcome"] == "PASS", record["verdict"]["reason"]
    assert [line.split(":")[0] for line in record["verdict"]["not_available"]] == list(PROXY_ONLY_CHECKS)
    assert not set(PROXY_ONLY_CHECKS) & {c["name"] for c in record["verdict"]["checks"]}
    assert "not checked: proxy-saw-every-question: not available with an external router" in out


def test_a_router_that_drops_the_transfer_fails_for_it(deployment, tmp_path):
    run, record = judge(deployment, "drop-transfer", tmp_path / "results")
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert record["verdict"]["outcome"] == "FAIL"
    assert re.search(CANARY_REASONS["drop-transfer"], record["verdict"]["reason"]), \
        record["verdict"]["reason"]


def test_a_corrupted_kv_block_fails_for_it(deployment, tmp_path):
    run, record = judge(deployment, "corrupt-block", tmp_path / "results")
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert record["verdict"]["outcome"] == "FAIL"
    assert re.search(CANARY_REASONS["corrupt-block"], record["verdict"]["reason"]), \
        record["verdict"]["reason"]
    decode_logs = [path for name, path in deployment["logs"].items() if "decode" in name]
    assert any(APPLIED_PREFIX in Path(p).read_text(errors="replace") for p in decode_logs)
