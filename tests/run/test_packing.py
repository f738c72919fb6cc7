"""The GPU packer: what a group holds at its peak, which group starts first, which fits where,
and the packed run's child processes, admission and collected records (children here are tiny
Python processes that write a record: the harness's own logic, not evidence that P/D works)."""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from harness.cli.run import parallel_groups, packs, run_parser
from harness.cli.run_packed import child_options
from harness.core.cell import Cell
from harness.core.options import RunOptions, UsageError
from harness.judge.verdict import Policy
from harness.run.plan.packed import (PackedRun, collect_results, peak_overlap,
                                     started_while_another_ran)
from harness.run.plan.packing import (GIB, GpuRoom, Packer, group_jobs, max_parallel_groups,
                                      model_weight_bytes, server_bytes)
from harness.run.record import Recorder

TINY = "tiny-llama-gsm"


def cuda(backend="FLASH_ATTN", block=128, runner="v2", **kw) -> Cell:
    return Cell(model=TINY, backend=backend, prefill_block_size=block, decode_block_size=block,
                device="cuda", kv_buffer_device="cuda", runner=runner, **kw)


def jobs_of(cells, kv=512 << 20, weights=0, layout="shared"):
    return group_jobs(cells, kv_cache_bytes=lambda c: kv, weight_bytes=lambda c: weights,
                      layout=layout)


def test_a_tp1_group_needs_one_gpu_and_holds_a_baseline_and_two_pairs():
    cells = [cuda(block=64), cuda(block=64, fault="corrupt-block"), cuda(block=64, fault="drop-transfer")]
    assert len({c.baseline_key for c in cells}) == 1
    [job] = jobs_of(cells)
    assert job.gpus == 1
    # canaries share their clean cell's pair: one pair, so baseline + one pair at the peak
    assert job.servers_at_peak == 3
    assert job.peak_bytes == 3 * server_bytes(512 << 20, 0)


def test_the_split_layout_asks_for_prefill_plus_decode_gpus():
    [job] = jobs_of([cuda()], layout="split")
    assert job.gpus == 2


def test_flashinfer_groups_start_first_one_per_warm_key_then_profile_order():
    cells = [cuda("FLASH_ATTN", 16), cuda("FLASH_ATTN", 64), cuda("FLASHINFER", 16),
             cuda("FLASHINFER", 64), cuda("TRITON_ATTN", 16)]
    order = [j.cell_ids[0] for j in jobs_of(cells)]
    # the first of each warm key (backend here) leads, FlashInfer (slowest cold start) first
    assert order[0] == cells[2].cell_id
    assert set(order[:3]) == {cells[0].cell_id, cells[2].cell_id, cells[4].cell_id}
    assert order[3:] == [cells[1].cell_id, cells[3].cell_id]


def test_weights_of_a_published_shape():
    qwen3_06b = {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
                 "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
                 "vocab_size": 151936, "tie_word_embeddings": True}
    # Qwen3-0.6B has 0.6 B parameters (0.44 B without embeddings): 1.2 GB in bf16
    assert 1.0e9 < model_weight_bytes(qwen3_06b, "bfloat16") < 1.6e9


def test_the_packer_fills_a_gpu_by_memory_then_waits():
    room = GpuRoom(0, total_bytes=100 * GIB, free_bytes=100 * GIB)   # usable: 94 GiB
    jobs = jobs_of([cuda(block=b, runner=r) for b in (16, 64, 128) for r in ("v1", "v2")],
                   kv=int(10.5 * GIB))   # 12.5 GiB a server, 37.5 GiB a group
    packer = Packer([room], max_groups=10)
    placed = [packer.place(j) for j in jobs]
    assert placed[:2] == [(0,), (0,)] and placed[2:] == [None] * 4
    packer.release(jobs[0])
    assert packer.place(jobs[2]) == (0,)


def test_the_packer_caps_groups_by_cores_and_always_admits_a_lone_group():
    jobs = jobs_of([cuda(block=b) for b in (16, 64, 128)])
    packer = Packer([GpuRoom(0, 100 * GIB, 100 * GIB)], max_groups=2)
    assert [packer.place(j) for j in jobs] == [(0,), (0,), None]
    big = jobs_of([cuda(block=16)], kv=200 * GIB)[0]
    lone = Packer([GpuRoom(0, 100 * GIB, 100 * GIB)], max_groups=4)
    assert "GiB" in lone.never_fits(big)
    assert lone.place(big) == (0,)      # alone: vLLM's own check then says what is wrong


def test_groups_spread_over_gpus_most_room_first():
    jobs = jobs_of([cuda(block=b) for b in (16, 64, 128)])
    packer = Packer([GpuRoom(0, 80 * GIB, 80 * GIB), GpuRoom(1, 80 * GIB, 80 * GIB)], max_groups=8)
    assert [packer.place(j) for j in jobs] == [(0,), (1,), (0,)]


def test_max_parallel_groups_follows_the_cores():
    assert max_parallel_groups(16, 1) == 8
    assert max_parallel_groups(2, 1) == 1
    assert max_parallel_groups(2, 4) == 4


def test_parallel_groups_option():
    args = run_parser().parse_args(["--profile", "pr"])
    assert parallel_groups(args) is None
    assert parallel_groups(run_parser().parse_args(["--parallel-groups", "3"])) == 3
    with pytest.raises(SystemExit):   # refused by its type, one line
        run_parser().parse_args(["--parallel-groups", "0"])


def test_cpu_runs_pack_only_when_asked():
    cpu = [Cell(model=TINY, prefill_block_size=b, decode_block_size=b) for b in (64, 128)]
    assert not packs(cpu, None)
    assert packs(cpu, 2)
    assert not packs(cpu[:1], 2)     # one group: nothing to pack


def test_a_child_repeats_the_parents_options_but_not_its_selection():
    parser = run_parser()
    args = parser.parse_args(["--profile", "pr", "-k", "FLASH", "--limit", "30", "--no-kv-digest",
                              "--server-arg=--a", "--server-arg=--b", "--junit-xml", "x.xml",
                              "--max-starting", "4", "--parallel-groups", "3"])
    argv = child_options(args, parser)
    assert argv == ["--profile=pr", "--server-arg=--a", "--server-arg=--b", "--limit=30",
                    "--no-kv-digest", "--max-starting=4"]
    again = parser.parse_args(argv)
    assert (again.limit, again.no_kv_digest, again.server_arg, again.keyword) == (30, True, ["--a", "--b"], None)


def test_overlap_counters():
    spans = [(0, 10), (2, 5), (6, 12), (20, 21)]
    assert peak_overlap(spans) == 2
    assert started_while_another_ran(spans) == 2


CHILD = """
import json, pathlib, sys, time
run_dir, run_id, ids, sleep_s, exit_code = sys.argv[1:6]
time.sleep(float(sleep_s))
for cid in ids.split(","):
    if cid.endswith("lost"):
        continue
    out = pathlib.Path(run_dir, run_id); out.mkdir(parents=True, exist_ok=True)
    (out / f"{cid}.json").write_text(json.dumps({"schema_version": 1, "run_id": run_id,
        "created_at": str(time.time()), "cell": {"id": cid},
        "verdict": {"status": "PASS", "reason": "ok", "checks": []}}))
sys.exit(int(exit_code))
"""


def test_a_packed_run_admits_groups_as_others_end_and_collects_every_cell(tmp_path: Path):
    cells = [cuda(block=b) for b in (16, 64, 128)]
    jobs = jobs_of(cells)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    lost = {jobs[2].index}

    def argv(job):
        ids = ",".join(c + ("-lost" if job.index in lost else "") for c in job.cell_ids)
        return [sys.executable, str(script), str(tmp_path), f"run-{job.name}", ids,
                "0.6", "3" if job.index in lost else "0"]

    packer = Packer([GpuRoom(0, 100 * GIB, 100 * GIB)], max_groups=2)
    packed = PackedRun(jobs, packer, argv, lambda gpus: {"CUDA_VISIBLE_DEVICES": "7"}, tmp_path,
                       progress=lambda m: None, poll_s=0.05)
    began = time.monotonic()
    turns = packed.run()
    assert time.monotonic() - began < 5
    by_name = {t.job.name: t for t in turns}
    first, second, third = (by_name[j.name] for j in jobs)
    # two at once; the third started only once one of them had ended
    assert third.started_s >= min(first.ended_s, second.ended_s)
    assert second.started_s < first.ended_s
    record = json.loads(packed.write_record().read_text())
    assert record["peak_concurrent_groups"] == 2 and record["max_groups"] == 2

    recorder = Recorder(RunOptions(results_dir=str(tmp_path)), asdict(Policy()), "parent",
                        tmp_path, lambda m: None)
    results = collect_results(cells, turns, tmp_path, recorder)
    assert [r.cell.cell_id for r in results] == [c.cell_id for c in cells]
    outcomes = {r.cell.cell_id: r.verdict.outcome for r in results}
    lost_cell = jobs[2].cell_ids[0]
    assert outcomes[lost_cell] == "ERROR"
    assert "exited 3 without a record" in next(r for r in results if r.cell.cell_id == lost_cell).verdict.reason
    assert [o for c, o in outcomes.items() if c != lost_cell] == ["PASS", "PASS"]


def test_groups_at_once_is_what_the_packer_admits_in_order():
    jobs = jobs_of([cuda(block=b, runner=r) for b in (16, 64, 128) for r in ("v1", "v2")],
                   kv=int(10.5 * GIB))   # 37.5 GiB a group
    from harness.run.plan.packing import groups_at_once
    assert groups_at_once(jobs, [GpuRoom(0, 100 * GIB, 100 * GIB)], 8) == 2
    assert groups_at_once(jobs, [GpuRoom(0, 100 * GIB, 100 * GIB)], 1) == 1
    assert groups_at_once(jobs, [GpuRoom(0, 200 * GIB, 200 * GIB)] * 1, 8) == 5


def test_the_plugin_asks_the_packer_for_its_gpu_workers(pytestconfig, monkeypatch):
    """-n auto on a (pretended) 1-GPU machine of 80 GiB: the pr profile's tiny groups are
    bounded by the cores the packer allows, not by xdist's CPU count."""
    from harness import pytest_plugin
    from harness.core import platform
    monkeypatch.setattr(platform, "detect_gpus",
                        lambda: [platform.GpuDevice(0, "H100", 80 * GIB)])
    monkeypatch.setattr(platform, "query_gpu_used_bytes", lambda: {})
    monkeypatch.setattr("os.cpu_count", lambda: 16)

    class Config:
        def getoption(self, name):
            return {"pd_matrix": None, "pd_profile": "pr"}[name]
    assert pytest_plugin.pytest_xdist_auto_num_workers(Config()) == 8
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    # 32 cores' worth of groups, but 80 GiB hold fewer of the pr groups' peaks
    assert 8 < pytest_plugin.pytest_xdist_auto_num_workers(Config()) < 32
