"""The two-host topology's own logic, with a fake `ip` (no namespace is created here; the
root-only test_netns_root.py creates real ones): names, addresses, subnet choice, the ledger,
the order of the cleanup on every path, and servers placed in a namespace."""
from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from harness.core.cell import Cell
from harness.serve.net import netns as netns_mod
from harness.serve.deploy import DeployContext, Placement, pair_key, plan_pair
from harness.serve.net.netns import NetnsError, TopologyLedger, TwoHostTopology, process_env
from harness.serve.net.netns import sweep_orphan_topologies
from harness.serve.net.netns_plan import TopologyPlan, choose_subnet, subnets_in_use
from harness.serve.host.ports import PortAllocator
from harness.serve.launch.server_spec import Features, build_argv, build_env


class FakeIp:
    """Records every `ip` call; `fail_on` (a word in the command) makes that call fail;
    `outputs` answers commands starting with given words."""

    def __init__(self, fail_on: str | None = None, outputs: dict[str, str] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.fail_on, self.outputs = fail_on, outputs or {}

    def __call__(self, args):
        args = list(args)
        self.calls.append(args)
        joined = " ".join(args)
        if self.fail_on and self.fail_on in joined:
            return subprocess.CompletedProcess(["ip", *args], 2, "", "RTNETLINK answers: File exists\n")
        out = next((v for k, v in self.outputs.items() if joined.startswith(k)), "")
        return subprocess.CompletedProcess(["ip", *args], 0, out, "")


def plan(tag: str = "abc123", subnet: int = 7) -> TopologyPlan:
    return TopologyPlan(tag, subnet)


# ---- names and addresses ----------------------------------------------------------------------
def test_names_are_unique_per_tag_and_fit_the_kernel_limit():
    p = plan()
    assert p.namespaces == ("pdacc-abc123-p", "pdacc-abc123-d")
    assert p.root_links == ("pdaccabc123p", "pdaccabc123d")
    assert all(len(link) < 16 for link in p.root_links)          # IFNAMSIZ
    assert set(plan("ffffff").namespaces).isdisjoint(p.namespaces)


def test_addresses_three_point_to_point_links_in_the_topologys_own_slash24():
    p = plan(subnet=7)
    net = ipaddress.ip_network("10.237.7.0/24")
    pre, dec = p.prefill, p.decode
    addrs = [pre.root_address, pre.address, dec.root_address, dec.address, pre.kv_address,
             dec.kv_address]
    assert addrs == ["10.237.7.1", "10.237.7.2", "10.237.7.5", "10.237.7.6", "10.237.7.9",
                     "10.237.7.10"]
    assert all(ipaddress.ip_address(a) in net for a in addrs)

    def slash30(a):
        return ipaddress.ip_interface(f"{a}/30").network
    # each /30 is one link: root<->prefill, root<->decode, prefill<->decode, nothing shared
    assert slash30(pre.root_address) == slash30(pre.address)
    assert slash30(dec.root_address) == slash30(dec.address)
    assert slash30(pre.kv_address) == slash30(dec.kv_address)
    assert len({slash30(pre.address), slash30(dec.address), slash30(pre.kv_address)}) == 3
    with pytest.raises(ValueError, match="only prefill and decode"):
        p.host("baseline")


def test_up_commands_make_both_namespaces_first_and_bring_every_link_up():
    cmds = plan().up_commands()
    assert cmds[:2] == [["netns", "add", "pdacc-abc123-p"], ["netns", "add", "pdacc-abc123-d"]]
    joined = [" ".join(c) for c in cmds]
    assert "-n pdacc-abc123-p link set lo up" in joined and "-n pdacc-abc123-d link set lo up" in joined
    # the P<->D link is made between the namespaces: never visible in the root namespace
    assert "-n pdacc-abc123-p link add kv0 type veth peer name kv0 netns pdacc-abc123-d" in joined
    for ns in plan().namespaces:
        assert f"-n {ns} link set kv0 up" in joined and f"-n {ns} link set up0 up" in joined
    assert "addr add 10.237.7.1/30 dev pdaccabc123p" in joined


def test_down_commands_links_first_then_namespaces():
    assert plan().down_commands() == [
        ["-n", "pdacc-abc123-p", "link", "del", "kv0"],
        ["link", "del", "pdaccabc123p"], ["link", "del", "pdaccabc123d"],
        ["netns", "del", "pdacc-abc123-p"], ["netns", "del", "pdacc-abc123-d"]]


# ---- subnet choice ---------------------------------------------------------------------------
ADDRS = """1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever
4: eth0    inet 10.237.3.17/8 brd 10.255.255.255 scope global eth0\\       valid_lft forever
"""
ROUTES = """default via 10.0.0.1 dev eth0
10.0.0.0/8 dev eth0 proto kernel scope link src 10.237.3.17
10.237.40.0/22 dev vpn0 scope link
"""


def test_subnets_in_use_reads_addresses_and_specific_routes():
    ip = FakeIp(outputs={"-o -4 addr": ADDRS, "-o -4 route": ROUTES})
    # 10.237.3.17 holds /24 #3 (its /8 netmask does not take them all); the broad 10.0.0.0/8
    # route is shadowed by our /30s; the /22 overlaps four /24s
    assert subnets_in_use(ip) == {3, 40, 41, 42, 43}


def test_choose_subnet_starts_from_the_run_and_skips_taken_ones():
    first = choose_subnet("run-a/abc123", set())
    assert choose_subnet("run-a/abc123", set()) == first                # the seed decides
    assert choose_subnet("run-a/abc123", {first}) == (first + 1) % 256
    assert len({choose_subnet(f"run-{i}", set()) for i in range(20)}) > 10  # runs spread out
    with pytest.raises(NetnsError, match="no free /24"):
        choose_subnet("x", set(range(256)))


# ---- the ledger ------------------------------------------------------------------------------
def test_ledger_reserves_distinct_subnets_and_forgets(tmp_path):
    ledger = TopologyLedger(tmp_path)
    ip = FakeIp()
    a, b = ledger.reserve("run", ip), ledger.reserve("run", ip)
    assert a.tag != b.tag and a.subnet != b.subnet
    entries = json.loads(ledger.path.read_text())["topologies"]
    assert set(entries) == {a.tag, b.tag}
    assert entries[a.tag]["owner_pid"] == os.getpid()
    assert entries[a.tag]["namespaces"] == list(a.namespaces)
    ledger.forget(a.tag)
    assert set(json.loads(ledger.path.read_text())["topologies"]) == {b.tag}


def test_a_subnet_in_use_on_the_host_is_never_chosen(tmp_path, monkeypatch):
    monkeypatch.setattr(netns_mod, "choose_subnet",
                        lambda seed, taken: min(set(range(256)) - set(taken)))
    ip = FakeIp(outputs={"-o -4 addr": "2: eth1    inet 10.237.0.4/24 scope global eth1\n"})
    assert TopologyLedger(tmp_path).reserve("run", ip).subnet == 1


def test_sweep_removes_only_the_topologies_of_dead_owners(tmp_path):
    ledger = TopologyLedger(tmp_path)
    mine = ledger.reserve("run", FakeIp())
    dead = ledger.reserve("run", FakeIp())
    entries = json.loads(ledger.path.read_text())
    entries["topologies"][dead.tag]["owner_pid"] = 2 ** 22 + 12345    # no such process
    ledger.path.write_text(json.dumps(entries))
    ip = FakeIp()
    assert sweep_orphan_topologies(ledger, ip) == [dead.tag]
    assert ip.calls == dead.down_commands()
    assert set(json.loads(ledger.path.read_text())["topologies"]) == {mine.tag}
    assert sweep_orphan_topologies(ledger, FakeIp()) == []


def test_sweep_without_a_ledger_file_runs_nothing(tmp_path):
    ip = FakeIp()
    assert sweep_orphan_topologies(TopologyLedger(tmp_path / "none"), ip) == [] and ip.calls == []


# ---- create / remove on every path -----------------------------------------------------------
def test_create_then_remove_runs_up_then_down_and_forgets_the_entry(tmp_path):
    ledger = TopologyLedger(tmp_path)
    ip = FakeIp()
    topo = TwoHostTopology.reserve("run", ip=ip, ledger=ledger, check=False)
    ip.calls.clear()                                  # the reservation read `ip -o addr/route`
    with topo:
        assert ip.calls == topo.plan.up_commands()
        assert topo.tag in netns_mod._LIVE
    assert ip.calls[len(topo.plan.up_commands()):] == topo.plan.down_commands()
    assert topo.tag not in netns_mod._LIVE
    assert json.loads(ledger.path.read_text())["topologies"] == {}
    topo.remove()                                     # idempotent: nothing is run again
    assert len(ip.calls) == len(topo.plan.up_commands() + topo.plan.down_commands())


def test_an_exception_inside_removes_everything(tmp_path):
    ip = FakeIp()
    topo = TwoHostTopology.reserve("run", ip=ip, ledger=TopologyLedger(tmp_path), check=False)
    with pytest.raises(KeyboardInterrupt):
        with topo:
            raise KeyboardInterrupt                    # what SIGINT raises (process_registry)
    assert ip.calls[-len(topo.plan.down_commands()):] == topo.plan.down_commands()


def test_a_failed_step_removes_what_was_made_and_says_which_in_one_line(tmp_path):
    ip = FakeIp(fail_on="kv0 type veth")
    topo = TwoHostTopology.reserve("run", ip=ip, ledger=TopologyLedger(tmp_path), check=False)
    ip.calls.clear()
    with pytest.raises(NetnsError) as err:
        topo.create()
    assert "\n" not in str(err.value) and "link add kv0" in str(err.value)
    assert "File exists" in str(err.value)
    n_up = next(i for i, c in enumerate(ip.calls) if "kv0" in c and "add" in c) + 1
    assert ip.calls[n_up:] == topo.plan.down_commands()
    assert not topo.created and topo.tag not in netns_mod._LIVE


def test_remove_at_exit_covers_a_topology_left_live(tmp_path):
    ip = FakeIp()
    topo = TwoHostTopology.reserve("run", ip=ip, ledger=TopologyLedger(tmp_path), check=False)
    topo.create()
    netns_mod._remove_live()
    assert ip.calls[-5:] == topo.plan.down_commands() and not topo.created


def test_not_root_or_no_ip_is_one_line_before_anything(tmp_path, monkeypatch):
    monkeypatch.setattr(netns_mod, "netns_unavailable_reason", lambda: "network: netns needs root")
    ip = FakeIp()
    with pytest.raises(NetnsError, match="^network: netns needs root$"):
        TwoHostTopology.reserve("run", ip=ip, ledger=TopologyLedger(tmp_path))
    assert ip.calls == [] and not (tmp_path / "netns.json").exists()


# ---- evidence --------------------------------------------------------------------------------
STATS = json.dumps([{"ifname": "kv0", "stats64": {"rx": {"bytes": 5000}, "tx": {"bytes": 300}}}])


def test_link_bytes_and_evidence_are_the_decodes_kv0_delta():
    ip = FakeIp(outputs={"-n pdacc-abc123-d -s -j link show dev kv0": STATS})
    topo = TwoHostTopology(plan(), ip=ip)
    assert topo.link_bytes("decode") == (5000, 300)
    ev = topo.evidence((1000, 100), {"decode-0": {"UCX_TLS": "tcp"}})
    assert (ev["decode_rx_bytes"], ev["decode_tx_bytes"]) == (4000, 200)
    assert ev["addresses"]["prefill"] == {"netns": "pdacc-abc123-p", "http": "10.237.7.2",
                                          "kv": "10.237.7.9"}
    assert ev["ucx"] == {"decode-0": {"UCX_TLS": "tcp"}}
    assert TwoHostTopology(plan(), ip=FakeIp()).evidence((1, 1), {})["decode_rx_bytes"] is None


def test_process_env_reads_what_a_process_was_started_with():
    proc = subprocess.Popen(["sleep", "5"], env={"UCX_TLS": "tcp", "PATH": os.environ["PATH"]})
    try:
        deadline = time.monotonic() + 5                 # until it has exec'd (its own environ)
        while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"sleep") \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process_env(proc.pid) == {"UCX_TLS": "tcp", "UCX_NET_DEVICES": None}
    finally:
        proc.kill()
        proc.wait()
    assert process_env(None) == {"UCX_TLS": None, "UCX_NET_DEVICES": None}


# ---- servers in the namespaces ---------------------------------------------------------------
def _netns_pair(tmp_path: Path, monkeypatch, cell: Cell):
    ledger = TopologyLedger(tmp_path / "netns")
    monkeypatch.setattr(netns_mod.TwoHostTopology, "reserve", classmethod(
        lambda cls, seed, **kw: cls(ledger.reserve(seed, FakeIp()), ip=FakeIp(), ledger=ledger)))
    allocator = PortAllocator(lock_dir=tmp_path / "locks", port_range=(21400, 21800))
    ctx = DeployContext(allocator=allocator, placement=Placement(cpu_cores=(0, 1)),
                        log_dir=tmp_path, features=Features(), startup_timeout_s=10.0)
    return plan_pair(cell, ctx, model_path="/models/tiny", hybrid=False)


def test_a_netns_pair_runs_each_server_in_its_namespace_reached_at_its_address(tmp_path,
                                                                                monkeypatch):
    cell = Cell(model="tiny-llama-gsm", compile="eager", network="netns",
                extra_env=(("UCX_TLS", "all"),))
    pair = _netns_pair(tmp_path, monkeypatch, cell)
    topo = pair.topology
    assert topo is not None and topo.tag in pair.name
    for spec in pair.specs:
        host = topo.plan.host(spec.role)
        argv = build_argv(spec)
        assert argv[1:4] == ["netns", "exec", host.netns] and argv[4] == spec.python
        assert argv[argv.index("--host") + 1] == host.address
        assert spec.base_url == f"http://{host.address}:{spec.port}"
        env = build_env(spec, base_env={})
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == host.kv_address
        # the topology's restriction wins over the cell's own UCX_TLS
        assert (env["UCX_TLS"], env["UCX_NET_DEVICES"]) == ("tcp", "kv0")
        assert env["VLLM_HOST_IP"] == host.kv_address
    assert pair.urls("decode") == [f"http://10.237.{topo.plan.subnet}.6:{pair.specs[1].port}"]
    pair.stop()                                     # never launched: stop releases the ledger
    assert json.loads((tmp_path / "netns" / "netns.json").read_text())["topologies"] == {}


def test_a_local_pair_is_unchanged_and_never_shares_a_netns_pair(tmp_path, monkeypatch):
    local = Cell(model="tiny-llama-gsm", compile="eager")
    pair = _netns_pair(tmp_path, monkeypatch, local)
    assert pair.topology is None
    for spec in pair.specs:
        argv = build_argv(spec)
        assert argv[0] == spec.python and argv[argv.index("--host") + 1] == "127.0.0.1"
        assert build_env(spec, base_env={})["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
        assert "UCX_TLS" not in build_env(spec, base_env={})
    pair.stop()
    assert pair_key(local) != pair_key(local.replace(network="netns"))
