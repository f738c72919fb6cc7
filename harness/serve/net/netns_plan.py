"""The plan of a two-host topology (harness.serve.net.netns): names, addresses and the ``ip`` commands
that make and unmake it, and the choice of its subnet. Pure but for :func:`run_ip` (the one
place ``ip`` runs; tests pass a fake) and :func:`subnets_in_use` (which reads the root
namespace through it).
"""
from __future__ import annotations

import hashlib
import ipaddress
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

__all__ = ["KV_DEVICE", "UCX_ENV_KEYS", "Host", "IpRunner", "NetnsError", "TopologyPlan",
           "choose_subnet", "new_tag", "run_ip", "subnets_in_use"]

SUBNETS = ipaddress.ip_network("10.237.0.0/16")   # one /24 per topology
NS_PREFIX = "pdacc-"
LINK_PREFIX = "pdacc"          # root-side ends: pdacc<tag>p / pdacc<tag>d (12 chars < IFNAMSIZ)
UPLINK_DEVICE, KV_DEVICE = "up0", "kv0"
UCX_TLS = "tcp"
UCX_ENV_KEYS = ("UCX_TLS", "UCX_NET_DEVICES")

IpRunner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


class NetnsError(RuntimeError):
    """The two-host topology cannot be made here (one line: why)."""


def run_ip(args: Sequence[str]) -> "subprocess.CompletedProcess[str]":
    """``ip ARGS``, output captured; never raises for a non-zero exit."""
    ip = shutil.which("ip")
    if ip is None:
        raise NetnsError("network namespaces need iproute2's `ip`, not found on PATH")
    return subprocess.run([ip, *args], capture_output=True, text=True, timeout=30, check=False)


# ---- the plan: names, addresses, commands (pure) ---------------------------------------------
@dataclass(frozen=True)
class Host:
    """One simulated host: its namespace and its two addresses."""

    role: str          # "prefill" | "decode"
    netns: str
    address: str       # on its uplink: what the root namespace (proxy, health checks) reaches
    kv_address: str    # on the P<->D link: the connector's side channel and UCX
    root_link: str     # the uplink's end in the root namespace
    root_address: str  # that end's address

    def ucx_env(self) -> tuple[tuple[str, str], ...]:
        return (("UCX_TLS", UCX_TLS), ("UCX_NET_DEVICES", KV_DEVICE),
                ("VLLM_HOST_IP", self.kv_address))


@dataclass(frozen=True)
class TopologyPlan:
    tag: str           # 6 hex digits, unique per topology
    subnet: int        # N of 10.237.N.0/24

    @property
    def network(self) -> ipaddress.IPv4Network:
        return list(SUBNETS.subnets(new_prefix=24))[self.subnet]

    def _ip(self, offset: int) -> str:
        return str(self.network.network_address + offset)

    @property
    def prefill(self) -> Host:
        return Host("prefill", f"{NS_PREFIX}{self.tag}-p", self._ip(2), self._ip(9),
                    f"{LINK_PREFIX}{self.tag}p", self._ip(1))

    @property
    def decode(self) -> Host:
        return Host("decode", f"{NS_PREFIX}{self.tag}-d", self._ip(6), self._ip(10),
                    f"{LINK_PREFIX}{self.tag}d", self._ip(5))

    def host(self, role: str) -> Host:
        if role not in ("prefill", "decode"):
            raise ValueError(f"no host for a {role!r} server: only prefill and decode move")
        return self.prefill if role == "prefill" else self.decode

    @property
    def namespaces(self) -> tuple[str, str]:
        return self.prefill.netns, self.decode.netns

    @property
    def root_links(self) -> tuple[str, str]:
        return self.prefill.root_link, self.decode.root_link

    def up_commands(self) -> list[list[str]]:
        """The ``ip`` arguments that create the topology, in order."""
        p, d = self.prefill, self.decode
        cmds = [["netns", "add", p.netns], ["netns", "add", d.netns]]
        for h in (p, d):
            cmds += [["-n", h.netns, "link", "set", "lo", "up"],
                     ["link", "add", h.root_link, "type", "veth", "peer", "name", UPLINK_DEVICE,
                      "netns", h.netns],
                     ["addr", "add", f"{h.root_address}/30", "dev", h.root_link],
                     ["link", "set", h.root_link, "up"],
                     ["-n", h.netns, "addr", "add", f"{h.address}/30", "dev", UPLINK_DEVICE],
                     ["-n", h.netns, "link", "set", UPLINK_DEVICE, "up"]]
        cmds.append(["-n", p.netns, "link", "add", KV_DEVICE, "type", "veth", "peer", "name",
                     KV_DEVICE, "netns", d.netns])
        for h in (p, d):
            cmds += [["-n", h.netns, "addr", "add", f"{h.kv_address}/30", "dev", KV_DEVICE],
                     ["-n", h.netns, "link", "set", KV_DEVICE, "up"]]
        return cmds

    def down_commands(self) -> list[list[str]]:
        """The ``ip`` arguments that remove it: the P<->D link, the root-side links (a veth goes
        with its peer, even while a process still holds its namespace), then the namespaces."""
        return ([["-n", self.prefill.netns, "link", "del", KV_DEVICE]]
                + [["link", "del", link] for link in self.root_links]
                + [["netns", "del", ns] for ns in self.namespaces])


def new_tag() -> str:
    return uuid.uuid4().hex[:6]


def subnets_in_use(ip: IpRunner = run_ip) -> set[int]:
    """The /24s of 10.237.0.0/16 that hold an address of the root namespace, or that a route at
    least as specific as /16 overlaps (a broader one, 10.0.0.0/8 via eth0, is shadowed by our
    /30s anyway)."""
    nets = list(SUBNETS.subnets(new_prefix=24))
    found: list[ipaddress.IPv4Network] = []
    for line in (ip(["-o", "-4", "addr", "show"]).stdout or "").splitlines():
        fields = line.split()   # "2: eth0    inet 10.0.0.5/24 brd ..."
        if len(fields) > 3 and fields[2] == "inet":
            found += _networks(fields[3].split("/")[0])
    for line in (ip(["-o", "-4", "route", "show"]).stdout or "").splitlines():
        fields = line.split()   # "10.0.0.0/24 dev eth0 proto kernel ..."; "default via ..."
        if fields and fields[0] != "default":
            found += [n for n in _networks(fields[0]) if n.prefixlen >= SUBNETS.prefixlen]
    return {i for i, net in enumerate(nets) if any(net.overlaps(f) for f in found)}


def _networks(text: str) -> list[ipaddress.IPv4Network]:
    try:
        return [ipaddress.IPv4Network(text, strict=False)]
    except ValueError:
        return []


def choose_subnet(seed: str, taken: Iterable[int]) -> int:
    """The first free N from a hash of `seed` (the run and the tag) on; NetnsError when all are
    taken."""
    taken = set(taken)
    count = 2 ** (24 - SUBNETS.prefixlen)
    start = int(hashlib.sha256(seed.encode()).hexdigest(), 16) % count
    for i in range(count):
        if (start + i) % count not in taken:
            return (start + i) % count
    raise NetnsError(f"no free /24 left in {SUBNETS} for another two-host topology")
