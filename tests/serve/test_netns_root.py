"""Real network namespaces (root only; no vLLM server): the topology is made and unmade, the
proxy's namespace reaches both hosts, the hosts reach each other only over the P<->D link, its
byte counter sees what crosses it, NIXL over UCX's TCP crosses it (and over UCX's defaults does
not: shared memory is not isolated), and after an exception nothing is left."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.core.platform import netns_unavailable_reason
from harness.serve.net.netns import TopologyLedger, TwoHostTopology

REASON = netns_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"needs root and `ip`: {REASON}")


def ip(*args: str) -> str:
    return subprocess.run([shutil.which("ip") or "ip", *args], capture_output=True, text=True,
                          check=True).stdout


def leftovers(topo: TwoHostTopology) -> list[str]:
    """Namespaces and root-side links of `topo` still there."""
    names = ip("netns", "list") + ip("-o", "link")
    return [n for n in (*topo.plan.namespaces, *topo.plan.root_links) if n in names]


def in_ns(ns: str | None, code: str, env: dict | None = None, **kw) -> subprocess.Popen:
    prefix = [shutil.which("ip") or "ip", "netns", "exec", ns] if ns else []
    return subprocess.Popen([*prefix, sys.executable, "-c", textwrap.dedent(code)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


LISTEN = """
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 18123)); s.listen(); print("listening", flush=True)
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
        c, _ = s.accept(); c.sendall(b"x" * (1 << 20)); c.close()
"""
CONNECT = """
    import socket, sys
    try:
        c = socket.create_connection(("{addr}", 18123), timeout=2)
    except OSError as exc:
        print("unreachable", exc); sys.exit(0)
    got = 0
    while chunk := c.recv(65536):
        got += len(chunk)
    print("got", got)
"""


@pytest.fixture
def topology(tmp_path: Path):
    topo = TwoHostTopology.reserve(f"{tmp_path}/root-test", ledger=TopologyLedger(tmp_path))
    with topo:
        yield topo
    assert leftovers(topo) == []


def test_the_topology_is_made_with_both_namespaces_and_their_links(topology):
    assert leftovers(topology) == [*topology.plan.namespaces, *topology.plan.root_links]
    for host in (topology.plan.prefill, topology.plan.decode):
        links = ip("-n", host.netns, "-o", "link")
        assert all(f": {dev}" in links for dev in ("lo", "up0", "kv0"))
        assert "UP" in ip("-n", host.netns, "link", "show", "lo")
        assert host.kv_address in ip("-n", host.netns, "-o", "addr")


def test_tcp_crosses_the_p_to_d_link_and_its_counter_sees_it(topology):
    p, d = topology.plan.prefill, topology.plan.decode
    server = in_ns(p.netns, LISTEN)
    try:
        assert server.stdout.readline().strip() == "listening"
        before = topology.link_bytes("decode")
        from_d = in_ns(d.netns, CONNECT.format(addr=p.kv_address)).communicate(timeout=20)[0]
        after = topology.link_bytes("decode")
        assert from_d.strip() == f"got {1 << 20}"
        assert after[0] - before[0] >= 1 << 20           # the decode's kv0 received the MiB
        # the root namespace (the proxy's) reaches the prefill's uplink address...
        from_root = in_ns(None, CONNECT.format(addr=p.address)).communicate(timeout=20)[0]
        assert from_root.strip() == f"got {1 << 20}"
        # ...and the decode cannot: between the hosts there is only the P<->D link
        sideways = in_ns(d.netns, CONNECT.format(addr=p.address)).communicate(timeout=20)[0]
        assert sideways.startswith("unreachable")
    finally:
        server.kill()
        server.wait()


def test_an_exception_leaves_no_namespace_and_no_link(tmp_path):
    topo = TwoHostTopology.reserve(f"{tmp_path}/boom", ledger=TopologyLedger(tmp_path))
    holder = None
    with pytest.raises(RuntimeError, match="boom"):
        with topo:
            # a process still inside a namespace: its root-side link must go anyway
            holder = in_ns(topo.plan.decode.netns, "import time; time.sleep(30)")
            time.sleep(0.2)
            raise RuntimeError("boom")
    try:
        assert leftovers(topo) == []
        assert not [line for line in ip("-o", "link").splitlines() if topo.tag in line]
    finally:
        holder.kill()
        holder.wait()


NIXL_AGENT = """
    import pathlib, sys, time
    import numpy as np
    from nixl._api import nixl_agent, nixl_agent_config
    role, xdir, size = sys.argv[1], pathlib.Path(sys.argv[2]), 4 << 20
    agent = nixl_agent(role, nixl_agent_config(backends=["UCX"]))
    buf = np.full(size, 7 if role == "p" else 0, dtype=np.uint8)
    agent.register_memory(agent.get_reg_descs([(buf.ctypes.data, size, 0, "")], "DRAM"))
    descs = agent.get_xfer_descs([(buf.ctypes.data, size, 0)], "DRAM")
    if role == "p":
        (xdir / "p.meta").write_bytes(agent.get_agent_metadata())
        (xdir / "p.descs").write_bytes(agent.get_serialized_descs(descs))
        (xdir / "p.ready").touch()
        while not (xdir / "d.done").exists():
            agent.get_new_notifs(); time.sleep(0.02)
    else:
        while not (xdir / "p.ready").exists():
            time.sleep(0.02)
        name = agent.add_remote_agent((xdir / "p.meta").read_bytes())
        remote = agent.deserialize_descs((xdir / "p.descs").read_bytes())
        handle = agent.initialize_xfer("READ", descs, remote, name, b"done")
        state = agent.transfer(handle)
        while state not in ("DONE", "ERR"):
            state = agent.check_xfer_state(handle); time.sleep(0.001)
        (xdir / "d.done").touch()
        print(state, bool((buf == 7).all()), flush=True)
"""


def _nixl_read(topo: TwoHostTopology, work: Path, ucx: dict[str, str]) -> tuple[str, int]:
    """The decode READs 4 MiB from the prefill with NIXL; its output and the kv0 rx bytes."""
    work.mkdir()
    env = {**os.environ, **ucx}
    before = topo.link_bytes("decode")
    code = textwrap.dedent(NIXL_AGENT)
    prefix = [shutil.which("ip") or "ip", "netns", "exec"]
    pre = subprocess.Popen([*prefix, topo.plan.prefill.netns, sys.executable, "-c", code, "p",
                            str(work)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        dec = subprocess.run([*prefix, topo.plan.decode.netns, sys.executable, "-c", code, "d",
                              str(work)], env=env, capture_output=True, text=True, timeout=120)
        pre.wait(timeout=30)
    finally:
        if pre.poll() is None:
            pre.kill()
            pre.wait()
    after = topo.link_bytes("decode")
    lines = [line for line in dec.stdout.splitlines() if line.startswith(("DONE", "ERR"))]
    return (lines[-1] if lines else dec.stdout[-500:] + dec.stderr[-500:]), after[0] - before[0]


@pytest.mark.slow
def test_nixl_over_ucx_tcp_crosses_the_link_and_over_ucx_defaults_does_not(topology, tmp_path):
    pytest.importorskip("nixl._api", reason="NIXL is not installed next to this Python")
    size = 4 << 20
    result, rx = _nixl_read(topology, tmp_path / "tcp", {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "kv0"})
    assert result == "DONE True" and rx >= size, (result, rx)
    # the reason the verdict checks the link: with UCX's defaults the same READ succeeds
    # through shared memory, which network namespaces do not isolate
    result, rx = _nixl_read(topology, tmp_path / "default", {})
    assert result == "DONE True" and rx < size // 100, (result, rx)
