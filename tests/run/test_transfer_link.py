"""A netns pair's link evidence lands in the transfer proof (and the record); a pair on one
host has none."""
from __future__ import annotations

import json
import os
import subprocess
from types import SimpleNamespace

from harness.eval.metrics import TransferCounters
from harness.run.evidence.transfer_evidence import link_evidence, link_start, transfer_proof
from harness.serve.net.netns import TwoHostTopology
from harness.serve.net.netns_plan import TopologyPlan


class Counter:
    """A fake `ip` whose decode kv0 counter grows by 1 MB per reading."""

    def __init__(self) -> None:
        self.rx = 0

    def __call__(self, args):
        self.rx += 1_000_000
        out = json.dumps([{"stats64": {"rx": {"bytes": self.rx}, "tx": {"bytes": 10}}}])
        return subprocess.CompletedProcess(["ip", *args], 0, out, "")


def test_link_evidence_of_a_netns_pair_is_in_the_proof_and_its_dict():
    topo = TwoHostTopology(TopologyPlan("abc123", 9), ip=Counter())
    me = SimpleNamespace(pid=os.getpid())
    pair = SimpleNamespace(topology=topo, processes={"prefill-0": me, "decode-0": me})
    before = link_start(pair)
    link = link_evidence(pair, before)
    assert link["decode_rx_bytes"] == 1_000_000 and link["decode_netns"] == "pdacc-abc123-d"
    assert link["addresses"]["decode"]["http"] == "10.237.9.6"
    assert set(link["ucx"]) == {"prefill-0", "decode-0"}
    assert link["ucx"]["decode-0"]["UCX_TLS"] == os.environ.get("UCX_TLS")
    proof = transfer_proof([], TransferCounters(kv_bytes=5.0), False, [], link=link)
    assert proof.to_dict()["link"] == link


def test_a_pair_on_one_host_has_no_link_evidence():
    pair = SimpleNamespace(topology=None, processes={})
    assert link_start(pair) is None and link_evidence(pair, None) is None
    assert transfer_proof([], TransferCounters(), False, []).to_dict()["link"] is None
