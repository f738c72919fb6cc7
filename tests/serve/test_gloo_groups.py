"""The shared gloo group of a world of one rank, on real torch.distributed in a child process
(a process group is process-wide state): threads counted from /proc, collectives still correct."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from harness.serve.launch.server_spec import build_env
from harness.serve.plugins.idle import gloo_groups
from tests.serve.test_thread_budget import spec

CHILD = textwrap.dedent("""
    import json, os, sys, tempfile
    import torch, torch.distributed as dist
    from harness.serve.plugins.idle import gloo_groups

    def gloo_threads():
        names = []
        for t in os.listdir("/proc/self/task"):
            try:
                names.append(open(f"/proc/self/task/{t}/comm").read().strip())
            except FileNotFoundError:       # a thread that ended since the listing
                pass
        return sum(n.startswith("gloo") for n in names)

    def settled_gloo_threads():
        # on a loaded host (CI, 2026-12-08) one loop thread of 7 was not yet counted (6 of 7),
        # likely not yet running under its name: count once the number has held for 0.3 s
        # (at most 10 s)
        import time
        count, since, deadline = gloo_threads(), time.monotonic(), time.monotonic() + 10
        while time.monotonic() < deadline and time.monotonic() - since < 0.3:
            time.sleep(0.05)
            now = gloo_threads()
            if now != count:
                count, since = now, time.monotonic()
        return count

    if sys.argv[1] == "share":
        gloo_groups.patch_new_group(dist)
        gloo_groups.patch_new_group(dist)                 # idempotent
    store = dist.FileStore(tempfile.mktemp(), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    before = settled_gloo_threads()
    groups = [dist.new_group([0], backend="gloo", timeout=None) for _ in range(6)]
    groups.append(dist.new_group([0], backend="gloo", timeout=None, group_desc="tp:cpu"))
    sums = []
    for g in groups:
        t = torch.tensor([2.0, 3.0])
        dist.all_reduce(t, group=g)
        sums.append(t.tolist())
    with_groups = settled_gloo_threads()   # after use: a group's loop may start on its first op
    for g in groups:
        dist.destroy_process_group(g)                     # vLLM's GroupCoordinator.destroy
    dist.destroy_process_group()
    print(json.dumps({"added": with_groups - before, "distinct": len({id(g) for g in groups}),
                      "sums": sums}))
""")


def run_child(mode: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_seven_groups_of_one_rank_share_one_gloo_group_and_its_thread():
    alone, shared = run_child("torch"), run_child("share")
    assert alone["distinct"] == 7 and alone["added"] >= 7      # torch: a loop thread per group
    # the world group's own loop may start late, counted on either side
    assert shared["distinct"] == 1 and shared["added"] <= 2 <= alone["added"] - 5
    assert shared["sums"] == alone["sums"] == [[2.0, 3.0]] * 7  # a world of one: sum = itself


def test_cpu_servers_share_gpu_servers_do_not():
    assert build_env(spec(), base_env={})[gloo_groups.ENV] == "1"
    gpu = build_env(spec(device="cuda", backend="FLASH_ATTN", gpu_ids=(0,)), base_env={})
    assert gloo_groups.ENV not in gpu
