"""Two hosts on one machine: a P/D pair's prefill and decode in network namespaces of their own,
so that the connector's KV must cross a real network path (a veth link, over UCX's TCP transport).

One topology per P/D pair, in 10.237.N.0/24 (N chosen per topology, see below)::

    root namespace                 pdacc-<tag>-p (prefill)         pdacc-<tag>-d (decode)
    pdacc<tag>p  10.237.N.1/30 ─── up0 10.237.N.2/30
    pdacc<tag>d  10.237.N.5/30 ──────────────────────────────────── up0 10.237.N.6/30
                                   kv0 10.237.N.9/30 ───────────── kv0 10.237.N.10/30

Three veth pairs, not a bridge and not two uplinks with routes: (1) the P<->D link ``kv0``
carries nothing but prefill<->decode traffic (the connector's side channel and UCX), so the decode's ``kv0``
rx byte counter is the proof that the KV crossed the link, with no proxy HTTP mixed in; (2) no
forwarding between the uplinks (routes through the root namespace would need the host-wide
``net.ipv4.ip_forward=1``; a bridge is subject to ``br_netfilter``/iptables FORWARD rules and
stays behind after a crash); (3) every link has an end in one of the namespaces, so deleting
the namespaces deletes all of it. The decode cannot even reach the prefill's uplink address.
The harness's proxy and health checks stay in the root namespace and reach each server's HTTP
port on its uplink address; each namespace has its own loopback (vLLM's internal ports).

Namespaces do not isolate /dev/shm or SysV IPC: measured here, a connector READ of 8 MiB
between the two namespaces moved 896 bytes over ``kv0`` with UCX's default transports (shared memory),
8.48 MB with ``UCX_TLS=tcp UCX_NET_DEVICES=kv0``. So every server gets those two (and
``VLLM_HOST_IP``, its ``kv0`` address).

N: under the ledger's lock, starting from a hash of the run and the topology's tag, the first
/24 that no other topology of this host holds (the ledger) and no address or route of the root
namespace overlaps (``ip -o addr``, ``ip -o route``). The ledger
(``<port lock dir>/netns.json``: tag, N, owner pid/create_time/host) is written before anything
is created; :func:`sweep_orphan_topologies` removes the topologies of dead owners (the process
registry's orphan sweep calls it: before every server start and at the pytest session's end).
Live topologies are also removed at exit (atexit). Uses iproute2's ``ip`` through subprocess:
pyroute2 is not installed.
"""
from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import filelock

from harness.core.platform import netns_unavailable_reason
from harness.serve.host.liveness import process_create_time, this_host
from harness.serve.host.store import HostStore, drop_dead, problem_of_owner
from harness.serve.net.netns_plan import (KV_DEVICE, UCX_ENV_KEYS, Host, IpRunner, NetnsError,
                                      TopologyPlan, choose_subnet, new_tag, run_ip,
                                      subnets_in_use)
from harness.serve.launch.server_spec import ServerSpec

LOG = logging.getLogger(__name__)

__all__ = ["KV_DEVICE", "UCX_ENV_KEYS", "Host", "NetnsError", "TopologyLedger", "TopologyPlan",
           "TwoHostTopology", "process_env", "sweep_orphan_topologies"]

LEDGER_NAME = "netns.json"
_GONE = ("Cannot find device", "No such file or directory", "does not exist", "not found")


# ---- the host's ledger of topologies ------------------------------------------------------------
def topology_entry_problem(key: str, entry: dict[str, Any]) -> str | None:
    """Why a ledger entry must not be acted on (a sweep deletes the namespaces and links its tag
    names): a tag of new_tag's shape, a /24 index, a known owner."""
    tag, subnet = entry.get("tag"), entry.get("subnet")
    if not isinstance(tag, str) or not re.fullmatch(r"[0-9a-f]{6}", tag) or tag != key:
        return f"tag {tag!r} is not a topology's"
    if isinstance(subnet, bool) or not isinstance(subnet, int) or not 0 <= subnet < 256:
        return f"subnet {subnet!r} is not a /24 index"
    return problem_of_owner(entry)


class TopologyLedger:
    """``netns.json`` in this user's host state directory (a host store): every topology of
    this host, its subnet and its owner (pid, create_time, host), written before it is
    created."""

    def __init__(self, lock_dir: str | os.PathLike[str] | None = None) -> None:
        self.store = HostStore(LEDGER_NAME, "topologies", topology_entry_problem,
                               directory=lock_dir)
        self.path = self.store.path
        self._lock = self.store.lock

    def _load(self) -> dict[str, dict[str, Any]]:
        return self.store.load()

    def _save(self, entries: dict[str, dict[str, Any]]) -> None:
        self.store.save(entries)

    def reserve(self, seed: str, ip: IpRunner = run_ip) -> TopologyPlan:
        """A new plan whose subnet nobody holds, written as held by this process."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._lock:
                return self._reserve_locked(seed, ip)
        except (OSError, filelock.Timeout) as exc:
            raise NetnsError(f"netns ledger {self.path}: {exc}") from exc

    def _reserve_locked(self, seed: str, ip: IpRunner) -> TopologyPlan:
        entries = self._load()
        taken = {int(e["subnet"]) for e in entries.values() if "subnet" in e}
        tag = new_tag()
        plan = TopologyPlan(tag, choose_subnet(f"{seed}/{tag}", taken | subnets_in_use(ip)))
        entries[tag] = {"tag": tag, "subnet": plan.subnet, "owner_pid": os.getpid(),
                        "owner_create_time": process_create_time(os.getpid()),
                        "host": this_host(), "namespaces": list(plan.namespaces),
                        "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self._save(entries)
        return plan

    def forget(self, tag: str) -> None:
        try:
            with self._lock:
                entries = self._load()
                if entries.pop(tag, None) is not None:
                    self._save(entries)
        except (OSError, filelock.Timeout) as exc:
            LOG.warning("netns ledger %s: %s", self.path, exc)

    def take_orphans(self) -> list[TopologyPlan]:
        """Drop and return the topologies whose owner is dead."""
        if not self.path.exists():
            return []
        with self._lock:
            entries = self._load()
            dead = drop_dead(entries)
            if dead:
                self._save(entries)
        return [TopologyPlan(str(e["tag"]), int(e["subnet"])) for e in dead.values()]


# ---- a live topology ---------------------------------------------------------------------------
_LIVE: dict[str, "TwoHostTopology"] = {}
_LIVE_LOCK = threading.Lock()


class TwoHostTopology:
    """A reserved (then created, then removed) topology. ``with`` creates and removes it;
    :meth:`remove` runs on every exit path and is idempotent."""

    def __init__(self, plan: TopologyPlan, *, ip: IpRunner = run_ip,
                 ledger: TopologyLedger | None = None) -> None:
        self.plan, self.ip, self.ledger = plan, ip, ledger
        self.created = False
        self._lock = threading.Lock()

    @classmethod
    def reserve(cls, seed: str, *, ip: IpRunner = run_ip, ledger: TopologyLedger | None = None,
                check: bool = True) -> "TwoHostTopology":
        """A new topology for this host (nothing created yet). NetnsError when this machine
        cannot make namespaces (`check`: not root, no `ip`)."""
        reason = netns_unavailable_reason() if check else None
        if reason:
            raise NetnsError(reason)
        ledger = ledger or TopologyLedger()
        return cls(ledger.reserve(seed, ip), ip=ip, ledger=ledger)

    @property
    def tag(self) -> str:
        return self.plan.tag

    def create(self) -> "TwoHostTopology":
        """Run the up commands; on the first failure remove what was made and raise NetnsError."""
        with self._lock:
            if self.created:
                return self
            with _LIVE_LOCK:
                _LIVE[self.tag] = self
            self.created = True
            for args in self.plan.up_commands():
                result = self.ip(args)
                if result.returncode != 0:
                    self._remove_locked()
                    why = (result.stderr or result.stdout or "").strip().splitlines()
                    raise NetnsError(f"two-host topology {self.tag}: `ip {' '.join(args)}` failed: "
                                     f"{why[-1] if why else f'exit {result.returncode}'}")
        LOG.info("two-host topology %s up: prefill %s, decode %s", self.tag, self.plan.prefill,
                 self.plan.decode)
        return self

    def remove(self) -> None:
        """Remove links and namespaces (run after the servers stopped) and the ledger entry."""
        with self._lock:
            self._remove_locked()

    def _remove_locked(self) -> None:
        if self.created:
            for args in self.plan.down_commands():
                result = self.ip(args)
                err = (result.stderr or "").strip()
                if result.returncode != 0 and not any(g in err for g in _GONE):
                    LOG.warning("two-host topology %s: `ip %s`: %s", self.tag, " ".join(args), err)
            self.created = False
        with _LIVE_LOCK:
            _LIVE.pop(self.tag, None)
        if self.ledger is not None:
            self.ledger.forget(self.tag)

    def __enter__(self) -> "TwoHostTopology":
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # -- servers in it ----------------------------------------------------------------------
    def place(self, spec: ServerSpec, ip_path: str | None = None) -> ServerSpec:
        """`spec` run inside its role's namespace: bound to the uplink address, side channel and
        UCX on the P<->D link, UCX restricted to TCP (applied after the cell's own env)."""
        host = self.plan.host(spec.role)
        ip_path = ip_path or shutil.which("ip") or "ip"
        return dataclasses.replace(
            spec, host=host.address, side_channel_host=host.kv_address,
            launch_prefix=(ip_path, "netns", "exec", host.netns),
            extra_env=(*spec.extra_env, *host.ucx_env()))

    # -- evidence -----------------------------------------------------------------------------
    def link_bytes(self, role: str = "decode") -> tuple[int, int] | None:
        """(rx, tx) bytes of `role`'s P<->D device so far; None when unreadable."""
        result = self.ip(["-n", self.plan.host(role).netns, "-s", "-j", "link", "show", "dev",
                          KV_DEVICE])
        try:
            stats = json.loads(result.stdout)[0]["stats64"]
            return int(stats["rx"]["bytes"]), int(stats["tx"]["bytes"])
        except (ValueError, KeyError, IndexError, TypeError):
            return None

    def evidence(self, before: tuple[int, int] | None,
                 ucx: dict[str, dict[str, str | None]]) -> dict[str, Any]:
        """The record's `transfer.link`: the decode's P<->D bytes since `before`, the addresses,
        and the UCX settings each server ran with (`ucx`)."""
        after = self.link_bytes("decode")
        rx = tx = None
        if before is not None and after is not None:
            rx, tx = after[0] - before[0], after[1] - before[1]
        return {"network": "netns", "topology": self.tag, "device": KV_DEVICE,
                "decode_netns": self.plan.decode.netns, "decode_rx_bytes": rx,
                "decode_tx_bytes": tx,
                "addresses": {h.role: {"netns": h.netns, "http": h.address, "kv": h.kv_address}
                              for h in (self.plan.prefill, self.plan.decode)},
                "ucx": ucx}


def process_env(pid: int | None, keys: Sequence[str] = UCX_ENV_KEYS) -> dict[str, str | None]:
    """`keys` of the environment process `pid` was started with (/proc/PID/environ)."""
    found: dict[str, str | None] = {k: None for k in keys}
    if pid is None:
        return found
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return found
    for item in raw.split(b"\0"):
        key, _, value = item.decode(errors="replace").partition("=")
        if key in found:
            found[key] = value
    return found


def sweep_orphan_topologies(ledger: TopologyLedger | None = None,
                            ip: IpRunner | None = None) -> list[str]:
    """Remove the topologies of dead harnesses on this host; returns their tags."""
    try:
        orphans = (ledger or TopologyLedger()).take_orphans()
    except (OSError, filelock.Timeout) as exc:
        LOG.warning("netns ledger: %s", exc)
        return []
    for plan in orphans:
        LOG.warning("removing two-host topology %s left by a dead harness: %s", plan.tag,
                    ", ".join(plan.namespaces))
        leftover = TwoHostTopology(plan, ip=ip or run_ip)
        leftover.created = True
        try:
            leftover.remove()
        except NetnsError as exc:  # no `ip` any more
            LOG.warning("could not remove %s: %s", plan.tag, exc)
    return [plan.tag for plan in orphans]


def _remove_live() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE.values())
    for topology in live:
        try:
            topology.remove()
        except Exception:  # noqa: BLE001 - exiting: remove the others
            LOG.exception("removing two-host topology %s at exit", topology.tag)


# Registered at import, before the process registry's stop_all (which imports this module), so
# at exit (handlers run last-registered first) the servers stop before their namespaces go.
atexit.register(_remove_live)
