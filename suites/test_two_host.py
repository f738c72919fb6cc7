"""Two hosts on one machine, for real (root only; starts vLLM servers): the smoke dense cell with
`network: netns` (prefill and decode in network namespaces of their own, UCX over TCP on a veth
link) PASSes through the normal runner, and its record proves that the KV crossed that link;
a run interrupted by SIGINT in the middle of its P/D evaluation leaves no namespace, no link and
no server process behind. docs/two-host.md describes the topology.
"""
from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.core.platform import netns_unavailable_reason
from harness.serve.net.netns import LEDGER_NAME
from harness.serve.host.ports import default_lock_dir
from harness.serve.supervision.ledger import LEDGER_NAME as PROCESS_LEDGER

REASON = netns_unavailable_reason()
pytestmark = [pytest.mark.slow, pytest.mark.extended,
              pytest.mark.skipif(REASON is not None, reason=f"needs root and `ip`: {REASON}")]

CELL_ID = "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-netns"
RUN_ARGV = [sys.executable, "-m", "harness.cli.main", "run", "--model", "tiny-llama-gsm",
            "--backend", "CPU_ATTN", "--block-size", "128", "--compile", "eager",
            "--network", "netns"]
SUBNETS = ipaddress.ip_network("10.237.0.0/16")


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def ledger(name: str, key: str) -> dict[str, dict]:
    try:
        return json.loads((default_lock_dir() / name).read_text()).get(key, {})
    except (OSError, ValueError):
        return {}


def owned_by(pid: int) -> tuple[list[dict], list[dict]]:
    """(topologies, server groups) the ledgers hold for the harness `pid`."""
    topologies = [e for e in ledger(LEDGER_NAME, "topologies").values() if e["owner_pid"] == pid]
    groups = [e for e in ledger(PROCESS_LEDGER, "groups").values() if e["owner_pid"] == pid]
    return topologies, groups


def left_of(tags: set[str]) -> list[str]:
    """Namespaces and links of these topologies still on the host."""
    lines = ip("netns", "list").splitlines() + ip("-o", "link").splitlines()
    return [line for line in lines if any(tag in line for tag in tags)]


def alive(pid: int, create_time: float | None) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and (
            create_time is None or abs(proc.create_time() - create_time) < 1.0)
    except psutil.NoSuchProcess:
        return False


def test_the_smoke_cell_passes_with_the_kv_over_the_veth_link(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run = subprocess.run(RUN_ARGV + ["--results-dir", str(results)], capture_output=True,
                         text=True, timeout=1800)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    (record_path,) = results.glob(f"*/{CELL_ID}.json")
    record = json.loads(record_path.read_text())
    verdict, transfer = record["verdict"], record["metrics"]["transfer"]
    assert verdict["outcome"] == "PASS", verdict["reason"]
    checks = {c["name"]: c for c in verdict["checks"]}
    assert checks["kv-crossed-the-link"]["passed"], checks["kv-crossed-the-link"]["detail"]
    link = transfer["link"]
    assert transfer["kv_bytes"] > 0
    assert link["decode_rx_bytes"] >= transfer["kv_bytes"], (link, transfer["kv_bytes"])
    for role in ("prefill", "decode"):
        where = link["addresses"][role]
        assert where["netns"].startswith("pdacc-") and where["netns"].endswith(role[0])
        assert ipaddress.ip_address(where["http"]) in SUBNETS
        assert ipaddress.ip_address(where["kv"]) in SUBNETS
    assert link["ucx"] and all(env == {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "kv0"}
                               for env in link["ucx"].values()), link["ucx"]
    assert left_of({link["topology"]}) == []


def test_sigint_mid_evaluation_leaves_no_namespace_link_or_server(tmp_path: Path) -> None:
    log = open(tmp_path / "run.log", "w")
    run = subprocess.Popen(RUN_ARGV + ["--results-dir", str(tmp_path / "results")],
                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    topologies: list[dict] = []
    groups: dict[int, dict] = {}
    try:
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline and run.poll() is None:
            found, servers = owned_by(run.pid)
            topologies = found or topologies
            groups.update({int(g["pgid"]): g for g in servers})
            text = (tmp_path / "run.log").read_text(errors="replace")
            if "evaluating P/D" in text and topologies and left_of({t["tag"] for t in topologies}):
                break
            time.sleep(0.5)
        assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        time.sleep(3)                                     # requests in flight over the link
        found, servers = owned_by(run.pid)
        groups.update({int(g["pgid"]): g for g in servers})
        tags = {t["tag"] for t in topologies + found}
        assert tags and left_of(tags), "the run's namespaces should exist before the SIGINT"
        assert len(groups) >= 3, f"expected baseline, prefill and decode servers: {groups}"
        os.kill(run.pid, signal.SIGINT)
        run.wait(timeout=180)
        time.sleep(1.0)
        assert run.returncode != 0
        assert left_of(tags) == [], f"left behind after SIGINT: {left_of(tags)}"
        survivors = [g for pgid, g in groups.items() if alive(pgid, g.get("create_time"))]
        assert not survivors, f"server processes left behind after SIGINT: {survivors}"
        assert owned_by(run.pid) == ([], []), "the ledgers still name the interrupted run"
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        log.close()
