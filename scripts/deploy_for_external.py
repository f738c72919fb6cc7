#!/usr/bin/env python
"""Bring up a P/D deployment for `pd-accuracy run --deployment` to judge, as a user would: the
smoke dense cell's servers (tiny-llama-gsm, CPU_ATTN, block 128, eager) started with the
harness's own deploy code, plus three copies of the harness proxy playing the user's router
(clean, drop-transfer, and tagging every request for a corrupt-block fault on block 2, which
the decode server is armed for). Writes one deployment file per way of judging it:

  harness-proxy.yaml   router: harness-proxy over the prefill and decode servers (every check)
  router.yaml          the clean "user router" (the proxy-only checks are not available)
  drop-transfer.yaml   a router that never hands decode the KV params (must FAIL: recomputed)
  corrupt-block.yaml   a router whose requests get block 2 of their KV zeroed (must FAIL)

then `ready.json` (the files and server URLs), and keeps everything up until SIGTERM/SIGINT
or until its stdin closes. Three vLLM servers at most (baseline, prefill, decode); every
process is in its own group and is stopped on every exit path (harness.serve.supervision.process).

    python scripts/deploy_for_external.py --out /tmp/ext-deploy &   # kill -TERM it to stop
    ... | python scripts/deploy_for_external.py --out DIR     # or: stops when the pipe closes
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import stat
import sys
import time
from pathlib import Path

import yaml

from harness.core.atomic import atomic_write_text
from harness.core.cell import Cell
from harness.serve.deploy import (DeployContext, Placement, ProxyDeployment, plan_baseline,
                                  plan_pair)
from harness.serve.launch.models import resolve
from harness.protocol.faults import request_tag_for
from harness.serve.host.ports import PortAllocator
from harness.serve.supervision.process import install_signal_handlers
from harness.serve.launch.server_spec import Features

CELL = Cell(model="tiny-llama-gsm", compile="eager")   # CPU_ATTN, block 128: the smoke cell
ROUTERS = {   # file name -> (proxy fault, request tag)
    "router": (None, ""),
    "drop-transfer": ("drop-transfer", ""),
    "corrupt-block": (None, request_tag_for("corrupt-block", (("PD_ACCURACY_FAULT_BLOCK", "2"),))),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="where the files and logs go")
    p.add_argument("--startup-timeout", type=float, default=900.0,
                   help="seconds the three servers may take to become healthy")
    p.add_argument("--exit-after", type=float, default=None, metavar="S",
                   help="stop everything after S seconds (default: on a signal or stdin EOF)")
    return p.parse_args(argv)


def deployment_files(out: Path, baseline_url: str, prefill: list[str], decode: list[str],
                     routers: dict[str, str]) -> dict[str, str]:
    """Write the deployment files; their paths by name."""
    base = {"model": CELL.model_short, "task": "auto", "timeout_s": 30,
            "baseline": {"url": baseline_url}}
    files = {"harness-proxy": {**base, "name": "smoke-harness-proxy",
                               "pd": {"router": "harness-proxy", "prefill": prefill,
                                      "decode": decode}}}
    for name, url in routers.items():
        files[name] = {**base, "name": f"smoke-{name}", "pd": {"router": url},
                       "metrics": {"decode": [f"{u}/metrics" for u in decode],
                                   "prefill": [f"{u}/metrics" for u in prefill]}}
    paths = {}
    for name, data in files.items():
        path = out / f"{name}.yaml"
        atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))
        paths[name] = str(path)
    return paths


def wait_until_told(exit_after: float | None) -> None:
    """Until stdin closes (the caller went away) or `exit_after` seconds; signals end it too."""
    deadline = None if exit_after is None else time.monotonic() + exit_after
    try:   # only a pipe or socket says the caller went away (/dev/null is always at EOF)
        mode = os.fstat(sys.stdin.fileno()).st_mode
        stdin_open = stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)
    except (AttributeError, OSError, ValueError):
        stdin_open = False
    while deadline is None or time.monotonic() < deadline:
        if stdin_open:
            ready, _, _ = select.select([sys.stdin], [], [], 1.0)
            if ready and not sys.stdin.buffer.read1(4096):
                return
        else:
            time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out.resolve()
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    install_signal_handlers()   # SIGTERM/SIGINT: every managed process stopped, then exit
    allocator = PortAllocator()
    model = resolve(CELL.model)
    ctx = DeployContext(allocator=allocator, placement=Placement.detect(), log_dir=logs,
                        features=Features.detect(), startup_timeout_s=args.startup_timeout)
    baseline = plan_baseline(CELL, ctx, model_path=model.path, hybrid=model.hybrid)
    # decode breaks tagged requests only
    pair = plan_pair(CELL, ctx, model_path=model.path, hybrid=model.hybrid, arm_faults=True)
    with contextlib.ExitStack() as stack:
        stack.callback(baseline.stop)
        stack.callback(pair.stop)
        print(f"starting baseline and P/D pair of {CELL.cell_id} (logs in {logs})", flush=True)
        baseline.launch()
        pair.launch()
        baseline.wait()
        pair.wait()
        routers = {}
        for name, (fault, tag) in ROUTERS.items():
            port = allocator.reserve(1, owner=f"router:{name}")[0]
            proxy = stack.enter_context(ProxyDeployment(
                pair, port=port, log_dir=logs, fault=fault, request_tag=tag,
                records_path=out / f"{name}-router-records.jsonl", allocator=allocator,
                # each router's prompts in a prefix-cache space of their own: a canary's decode
                # must receive (and break) blocks, not find the clean run's in its cache
                cache_salt=f"router-{name}"))
            routers[name] = proxy.base_url
        files = deployment_files(out, baseline.baseline_endpoint().base_url,
                                 pair.urls("prefill"), pair.urls("decode"), routers)
        atomic_write_text(out / "ready.json", json.dumps({
            "files": files, "baseline": baseline.baseline_endpoint().base_url,
            "prefill": pair.urls("prefill"), "decode": pair.urls("decode"),
            "routers": routers, "logs": {**baseline.logs(), **pair.logs()}}, indent=1) + "\n")
        print(f"ready: {out / 'ready.json'}", flush=True)
        wait_until_told(args.exit_after)
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
