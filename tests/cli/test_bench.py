"""`pd-accuracy bench`'s arithmetic on readings (no run)."""
from __future__ import annotations

from collections import namedtuple

import pytest

from harness.cli.bench import busy_share

Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")


def times(user=0.0, system=0.0, idle=0.0, iowait=0.0, steal=0.0) -> Times:
    return Times(user, 0.0, system, idle, iowait, 0.0, 0.0, steal, 0.0, 0.0)


def test_busy_share_counts_idle_and_iowait_as_idle():
    before = times(user=100, system=10, idle=50, iowait=5)
    after = times(user=160, system=20, idle=70, iowait=15)     # 70 busy, 30 idle
    assert busy_share(before, after) == pytest.approx(0.7)


def test_stolen_time_is_not_idle():
    assert busy_share(times(), times(user=50, steal=25, idle=25)) == pytest.approx(0.75)


def test_no_time_passed_says_nothing():
    assert busy_share(times(user=1), times(user=1)) is None


def test_cpu_load_is_printed(capsys):
    import time as _time

    from harness.cli.bench import print_cpu_load
    from harness.run.evidence.cpu_load import CpuLoadSampler
    from rich.console import Console

    with CpuLoadSampler(interval_s=0.02) as sampler:
        _time.sleep(0.1)
    print_cpu_load(Console(width=200), sampler.summary())
    out = capsys.readouterr().out
    assert "run queue (procs_running): mean" in out and "steal" in out and "system" in out


def _log(imports: int, ready: int) -> str:
    """A server log: launched at 12:00:00, API server up after `imports` s, HTTP up at `ready` s."""
    return ("=== 2026-12-02T12:00:00 start server: python -m vllm.entrypoints.openai.api_server\n"
            f"(APIServer pid=1) INFO 12-02 12:00:{imports:02d} [api_utils.py:1] vLLM\n"
            f"(APIServer pid=1) INFO 12-02 12:00:{ready:02d} [entry.py:1] Starting vLLM server on "
            "http://127.0.0.1:1\n")


def test_bench_from_a_packed_run_gives_phase_medians_per_role(tmp_path):
    """`bench --from` of a packed run: each phase's median over all servers and per role (what
    docs/startup.md's GPU table reports), read from every group's logs, gzipped ones too."""
    import gzip

    from harness.cli.bench import bench_record, role_of

    (tmp_path / "packing.json").write_text('{"wall_s": 60.0, "gpus": 1}\n')
    logs = {"g1/logs/baseline-aaa-baseline.log": _log(10, 20),
            "g1/logs/pair-aaa-128-128-1-1-ok-prefill-0.log": _log(2, 10),
            "g1/logs/pair-aaa-128-128-1-1-ok-decode-0.log": _log(4, 14),
            "g2/logs/baseline-bbb-baseline.log": _log(20, 40),
            "g2/logs/pair-bbb-128-128-1-1-ok-decode-0.restart1.log": _log(6, 30),
            "g2/logs/proxy-123.log": "not a server\n"}
    for rel, text in logs.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    gz = tmp_path / "g2/logs/pair-bbb-128-128-1-1-ok-prefill-0.log.gz"
    gz.write_bytes(gzip.compress(_log(4, 12).encode()))

    record = bench_record(tmp_path)
    assert len(record["servers"]) == 6
    assert record["phase_median_s"]["imports"] == 5.0          # 2, 4, 4, 6, 10, 20
    assert record["by_role"]["baseline"] == {
        "servers": 2, "startup_median_s": 30.0,
        "phase_median_s": {**{p: None for p in record["phases"]}, "imports": 15.0, "ready": 15.0}}
    assert record["by_role"]["prefill"]["startup_median_s"] == 11.0
    assert record["by_role"]["decode"]["servers"] == 2
    assert record["by_role"]["decode"]["phase_median_s"]["ready"] == 17.0   # 10, 24
    assert role_of("proxy-123") is None and role_of("server-template") is None


def test_bench_of_a_stopped_packed_run_counts_each_group_once(tmp_path):
    """Cells of one group share its start-up wait (counted once); a group stopped before it
    ended wrote no group_total_s (its longest cell stands in); the machine is the records'."""
    import json

    from harness.cli.bench import bench_record

    def record(group: str, cell: str, wait: float, total: float, group_total=None) -> None:
        timings = {"startup_s": wait, "startup_wait_s": wait, "baseline_eval_s": 1.0,
                   "pd_eval_s": 2.0, "total_s": total}
        if group_total is not None:
            timings["group_total_s"] = group_total
        body = {"schema_version": 2, "run_id": group, "created_at": "2026-12-07T00:00:00Z",
                "cell": {"id": cell, "model": "m", "prefill_block_size": 16,
                         "decode_block_size": 16},
                "verdict": {"status": "PASS", "outcome": "PASS", "reason": ""},
                "metrics": {}, "timings": timings,
                "hardware": {"platform": "cuda", "gpus": ["NVIDIA H100 80GB HBM3"]}}
        (tmp_path / group).mkdir(exist_ok=True)
        (tmp_path / group / f"{cell}.json").write_text(json.dumps(body))

    record("g1", "a", 100.0, 150.0)              # stopped: no group_total_s
    record("g1", "a-canary", 100.0, 140.0)
    record("g2", "b", 50.0, 80.0, group_total=90.0)
    bench = bench_record(tmp_path)
    assert bench["hardware"]["platform"] == "cuda"
    assert bench["startup_wait_s"] == 150.0 and bench["cell_wall_s"] == 240.0
    assert bench["startup_share_of_cell_time"] == 150.0 / 240.0
