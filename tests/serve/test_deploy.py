"""Planning of deployments (no server starts): which ports each server gets."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from harness.core.cell import Cell
from harness.serve.deploy import (INTERNAL_PORT_BLOCK, DeployContext, Placement, plan_baseline,
                                  plan_pair)
from harness.serve.host.ports import PortAllocator
from harness.serve.launch.server_spec import Features


def _plan(tmp_path: Path, cell: Cell):
    allocator = PortAllocator(lock_dir=tmp_path / "locks", port_range=(21000, 21400))
    ctx = DeployContext(allocator=allocator, placement=Placement(cpu_cores=(0, 1)),
                        log_dir=tmp_path, features=Features(), startup_timeout_s=10.0)
    served = dict(model_path="/models/tiny", hybrid=False)
    return allocator, plan_baseline(cell, ctx, **served), plan_pair(cell, ctx, **served)


def test_every_server_gets_its_own_reserved_ports_for_vllm_internals(tmp_path):
    # the H200 lost a TP1 baseline to another server's torch.distributed port (EADDRINUSE):
    # each server's VLLM_PORT block is reserved, disjoint from every other port of the run
    cell = Cell(model="tiny-llama-gsm", backend="FLASH_ATTN", prefill_block_size=128,
                decode_block_size=128, device="cuda", kv_buffer_device="cuda",
                prefill_tp=2, decode_tp=1)
    allocator, baseline, pair = _plan(tmp_path, cell)
    specs = baseline.specs + pair.specs
    assert [s.role for s in specs] == ["baseline", "prefill", "decode"]
    used: list[int] = []
    for s in specs:
        assert s.internal_port is not None
        block = list(range(s.internal_port, s.internal_port + INTERNAL_PORT_BLOCK))
        assert set(block) <= set(baseline.reserved_ports + pair.reserved_ports)
        used += block + [s.port]
        if s.side_channel_port is not None:
            used += list(range(s.side_channel_port, s.side_channel_port + s.tp))
    assert len(used) == len(set(used))                      # nothing shared between servers
    assert set(used) == set(allocator.reservations())      # and all of it held in the registry
    baseline.stop()
    pair.stop()                                             # never launched: stop only releases
    assert allocator.reservations() == {}


def test_cpu_binding_gives_each_tp_rank_a_core():
    two = Placement(cpu_cores=(0, 1))
    assert two.core_for("baseline", 0) == "0" and two.core_for("decode", 0) == "1"
    assert two.core_for("prefill", 0, tp=2) == "0|1"       # vLLM CPU: one core list per rank
    assert two.core_for("decode", 0, tp=2) == "1|0"
    four = Placement(cpu_cores=(4, 5, 6, 7))
    assert four.core_for("prefill", 1, tp=2) == "6|7"      # the second TP2 prefill: next cores
    assert Placement(cpu_cores=()).core_for("prefill", 0, tp=2) is None


def test_pd_servers_write_kv_digests_next_to_their_logs_unless_turned_off(tmp_path, monkeypatch):
    from harness.protocol.kv_digest import DIGEST_FILE_ENV

    monkeypatch.setenv(DIGEST_FILE_ENV, "/inherited/from/the/shell.jsonl")
    cell = Cell(model="tiny-llama-gsm")
    ctx = DeployContext(
        allocator=PortAllocator(lock_dir=tmp_path / "locks", port_range=(21400, 21800)),
        placement=Placement(cpu_cores=(0, 1)), log_dir=tmp_path, features=Features(),
        startup_timeout_s=1.0, kv_digest=True)
    baseline = plan_baseline(cell, ctx, model_path="/m", hybrid=False)
    pair = plan_pair(cell, ctx, model_path="/m", hybrid=False)
    envs = {s.role: pair._process(s).env_overrides for s in pair.specs}
    assert envs["prefill"][DIGEST_FILE_ENV] == pair.digest_files("prefill")[0]
    assert envs["decode"][DIGEST_FILE_ENV].endswith("decode-0.kv-digest.jsonl")
    assert Path(envs["decode"][DIGEST_FILE_ENV]).parent == tmp_path
    assert DIGEST_FILE_ENV not in baseline._process(baseline.specs[0]).env_overrides
    off = plan_pair(cell, replace(ctx, kv_digest=False), model_path="/m", hybrid=False)
    assert off.digest_files("decode") == []
    assert all(DIGEST_FILE_ENV not in off._process(s).env_overrides for s in off.specs)


def test_pairs_of_other_instance_counts_keep_logs_and_digests_of_their_own(tmp_path):
    # 1P1D and 1P2D of one baseline key share a run's log folder: their files must not meet
    one = Cell(model="tiny-llama-gsm")
    allocator = PortAllocator(lock_dir=tmp_path / "locks", port_range=(21800, 22200))
    ctx = DeployContext(allocator=allocator, placement=Placement(cpu_cores=(0, 1)),
                        log_dir=tmp_path, features=Features(), startup_timeout_s=1.0,
                        kv_digest=True)
    single = plan_pair(one, ctx, model_path="/m", hybrid=False)
    fanout = plan_pair(one.replace(num_decode=2), ctx, model_path="/m", hybrid=False)
    assert "n1x2" in fanout.name and "n1x2" not in single.name
    assert [s.name for s in fanout.specs] == ["prefill-0", "decode-0", "decode-1"]
    # the second decode takes the other core: on 2 cores the decodes are not stacked
    assert [s.cpu_cores for s in fanout.specs] == ["0", "1", "0"]
    assert len(set(fanout.digest_files("decode"))) == 2
    assert not set(fanout.digest_files("decode")) & set(single.digest_files("decode"))
    single.stop()
    fanout.stop()


TOY_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_one_server_is_killed_and_relaunched_on_its_own_ports(tmp_path, monkeypatch):
    # the restart weather: one role crashes (SIGKILL to its group) and comes back, the rest stay
    import sys

    import harness.serve.deploy as deploy

    monkeypatch.setattr(deploy, "build_argv",
                        lambda spec, features: [sys.executable, "-c", TOY_SERVER, str(spec.port)])
    _, baseline, pair = _plan(tmp_path, Cell(model="tiny-llama-gsm"))
    baseline.stop()
    with pair:
        decode_before = pair.processes["decode-0"]
        killed = pair.kill("prefill")
        assert not killed.is_running() and decode_before.is_running()
        again = pair.relaunch("prefill")
        assert again.is_running() and again.pid != killed.pid
        assert pair.processes["prefill-0"] is again and pair.restarted == {"prefill-0": 1}
        assert again.log_path.name.endswith(".restart1.log")
        try:
            pair.relaunch("decode")
            raise AssertionError("a running server was started twice")
        except RuntimeError as error:
            assert "still running" in str(error)
    assert not again.is_running() and not decode_before.is_running()


def test_a_pair_of_a_shared_path_connector_gets_one_fresh_directory_of_its_own(tmp_path):
    cell = Cell(model="m", kv_connector="example")
    _, baseline, pair = _plan(tmp_path, cell)
    paths = {s.role: s.kv_shared_path for s in pair.specs}
    assert paths["prefill"] == paths["decode"] == str(tmp_path / f"{pair.name}.kv-files")
    assert baseline.specs[0].kv_shared_path is None and baseline.shared_dirs() == []
    stale = Path(paths["decode"]) / "0123abcd"
    stale.mkdir(parents=True)
    (stale / "model.layers.0.self_attn.attn.safetensors").write_bytes(b"old KV")
    pair.empty_shared_dirs()        # what launch() and each cell's evaluation do first
    assert pair.shared_dirs() == [Path(paths["decode"])] and not any(Path(paths["decode"]).iterdir())
    # NIXL's pairs share nothing on disk
    assert all(s.kv_shared_path is None for s in _plan(tmp_path, Cell(model="m"))[2].specs)
