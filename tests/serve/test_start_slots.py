"""Host-wide start-up slots: the cap holds across threads and processes, a slot never outlives
its server's start-up, and Deployments started in the runner's order cannot wait on each other.
Servers here are small real HTTP processes (not vLLM) that take a set time to become healthy."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from harness.serve.deploy import Deployment
from harness.serve.host.ports import PortAllocator
from harness.serve.supervision.process import ManagedProcess, ServerDiedError
from harness.serve.launch.server_spec import ServerSpec
from harness.serve.host.start_slots import ENV_VAR, StartSlots, StartSlotTimeout

FAKE_SERVER = textwrap.dedent("""
    import http.server, sys, time
    port, delay, journal, name, mode = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    with open(journal, "a") as f:
        f.write(f"start {name} {time.time()}\\n")
    time.sleep(delay)
    if mode == "die":
        print("RuntimeError: fake server crashed in start-up", flush=True)
        sys.exit(3)
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *args):
            pass
    server = http.server.HTTPServer(("127.0.0.1", port), Health)
    with open(journal, "a") as f:
        f.write(f"ready {name} {time.time()}\\n")
    server.serve_forever()
""")


class FakeDeployment(Deployment):
    """A Deployment whose servers are FAKE_SERVER processes (delay per server name)."""

    def __init__(self, name, specs, *, tmp_path: Path, delays: dict[str, float],
                 modes: dict[str, str] | None = None, **kw):
        super().__init__(name, specs, log_dir=tmp_path / "logs", **kw)
        self.script = tmp_path / "fake_server.py"
        self.script.write_text(FAKE_SERVER)
        self.journal = tmp_path / "journal.txt"
        self.delays, self.modes = delays, modes or {}

    def _process(self, spec: ServerSpec) -> ManagedProcess:
        key = f"{self.name}/{spec.name}"
        argv = [sys.executable, str(self.script), str(spec.port), str(self.delays[key]),
                str(self.journal), key, self.modes.get(key, "ok")]
        return ManagedProcess(spec.name, argv, self.log_dir / f"{self.name}-{spec.name}.log")


def _spec(role: str, port: int, index: int = 0) -> ServerSpec:
    return ServerSpec(role=role, index=index, model_path="/models/fake", served_model_name="fake",
                      port=port, backend="CPU_ATTN", block_size=32)


def _intervals(journal: Path) -> list[tuple[float, float]]:
    start, ready = {}, {}
    for line in journal.read_text().splitlines():
        kind, name, t = line.split()
        (start if kind == "start" else ready)[name] = float(t)
    return [(start[n], ready[n]) for n in start if n in ready]


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(r, -1) for _, r in intervals],
                    key=lambda e: (e[0], e[1]))
    most = cur = 0
    for _, step in events:
        cur += step
        most = max(most, cur)
    return most


@pytest.fixture
def ports(tmp_path):
    return PortAllocator(lock_dir=tmp_path / "ports").reserve(6, owner="test_start_slots")


def test_limit_holds_across_threads_and_a_freed_slot_is_reused(tmp_path):
    slots = StartSlots(2, lock_dir=tmp_path / "slots", poll_s=0.05)
    a, b = slots.acquire(), slots.acquire()
    assert {a.index, b.index} == {0, 1}
    with pytest.raises(StartSlotTimeout, match=f"2 servers may start at once.*{ENV_VAR}"):
        slots.acquire(timeout_s=0.3)
    a.release()
    a.release()  # idempotent
    c = slots.acquire(timeout_s=2)
    assert c.index == a.index
    cancelled = threading.Event()
    threading.Timer(0.2, cancelled.set).start()
    assert slots.acquire(cancelled=cancelled) is None  # a stopped deployment stops waiting
    b.release(), c.release()


def test_a_slot_held_by_another_process_counts_and_goes_with_it(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from harness.serve.host.start_slots import StartSlots
        slot = StartSlots(1, lock_dir={str(tmp_path / 'slots')!r}).acquire()
        print("held", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        slots = StartSlots(1, lock_dir=tmp_path / "slots", poll_s=0.05)
        with pytest.raises(StartSlotTimeout):
            slots.acquire(timeout_s=0.3)
    finally:
        holder.kill()
        holder.wait()
    slots.acquire(timeout_s=5).release()  # the dead holder's lock went with its process


def test_limit_from_env():
    assert StartSlots.limit_from_env({}) is None
    assert StartSlots.limit_from_env({ENV_VAR: "0"}) is None
    assert StartSlots.limit_from_env({ENV_VAR: " 8 "}) == 8
    for bad in ("eight", "-1"):
        with pytest.raises(ValueError, match=ENV_VAR):
            StartSlots.limit_from_env({ENV_VAR: bad})
    assert StartSlots.from_limit(None) is None and StartSlots.from_limit(0) is None


def test_runner_order_with_one_slot_starts_servers_one_at_a_time_without_deadlock(tmp_path, ports):
    # the runner launches the baseline and the pair, then waits for the baseline, then the pair;
    # with one slot each server waits for the previous one's health, and every deadline (2.5 s)
    # counts from the server's own start, although the three together take ~3.6 s
    slots = StartSlots(1, lock_dir=tmp_path / "slots", poll_s=0.05)
    delays = {"baseline/baseline": 1.2, "pair/prefill-0": 1.2, "pair/decode-0": 1.2}
    baseline = FakeDeployment("baseline", [_spec("baseline", ports[0])], tmp_path=tmp_path,
                              delays=delays, start_slots=slots, startup_timeout_s=2.5)
    pair = FakeDeployment("pair", [_spec("prefill", ports[1]), _spec("decode", ports[2])],
                          tmp_path=tmp_path, delays=delays, start_slots=slots, startup_timeout_s=2.5)
    started = time.monotonic()
    try:
        baseline.launch()
        pair.launch()
        baseline.wait()
        pair.wait()
        took = time.monotonic() - started
    finally:
        pair.stop()
        baseline.stop()
    intervals = _intervals(baseline.journal)
    assert len(intervals) == 3
    assert _max_overlap(intervals) == 1, intervals
    assert took >= 3.4 and pair.startup_s >= 2.5
    slots.acquire(timeout_s=2).release()  # nothing left holding the slot


def test_without_slots_servers_start_together(tmp_path, ports):
    delays = {"pair/prefill-0": 1.0, "pair/decode-0": 1.0}
    pair = FakeDeployment("pair", [_spec("prefill", ports[0]), _spec("decode", ports[1])],
                          tmp_path=tmp_path, delays=delays, startup_timeout_s=10)
    try:
        pair.start()
    finally:
        pair.stop()
    assert _max_overlap(_intervals(pair.journal)) == 2


def test_a_server_dying_in_start_up_frees_its_slot_and_fails_the_wait(tmp_path, ports):
    slots = StartSlots(1, lock_dir=tmp_path / "slots", poll_s=0.05)
    delays = {"pair/prefill-0": 0.3, "pair/decode-0": 0.3}
    pair = FakeDeployment("pair", [_spec("prefill", ports[0]), _spec("decode", ports[1])],
                          tmp_path=tmp_path, delays=delays, modes={"pair/prefill-0": "die"},
                          start_slots=slots, startup_timeout_s=10)
    pair.launch()
    try:
        with pytest.raises(ServerDiedError, match="fake server crashed in start-up"):
            pair.wait()
    finally:
        pair.stop()
    slots.acquire(timeout_s=2).release()


def test_stop_while_waiting_for_a_slot_starts_nothing(tmp_path, ports):
    slots = StartSlots(1, lock_dir=tmp_path / "slots", poll_s=0.05)
    held = slots.acquire()
    pair = FakeDeployment("pair", [_spec("prefill", ports[0]), _spec("decode", ports[1])],
                          tmp_path=tmp_path, delays={"pair/prefill-0": 0.1, "pair/decode-0": 0.1},
                          start_slots=slots, startup_timeout_s=10)
    pair.launch()
    time.sleep(0.3)
    pair.stop()
    assert pair.processes == {}
    assert not any(s.thread.is_alive() for s in pair._starters)
    with pytest.raises(RuntimeError, match="stopped while starting"):
        pair.wait()
    held.release()
