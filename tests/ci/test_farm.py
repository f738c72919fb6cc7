"""The local farm executor: Buildkite step semantics on fake steps (no vLLM)."""
from __future__ import annotations

import io
import os
import shlex
import stat
import sys
from pathlib import Path

import psutil
from rich.console import Console

from harness.core.cell import Cell
from harness.ci.farm import FAILED, NOT_RUN, PASSED, SOFT_FAILED, TIMED_OUT, Farm
from harness.ci.steps import farm_steps, interpolate
from harness.ci.pipeline import ANNOTATE_KEY, generate_pipeline

PY = sys.executable


def py(code: str) -> str:
    """A command running `code` with this interpreter."""
    return f"{shlex.quote(PY)} -c {shlex.quote(code)}"


def make_farm(tmp_path: Path, gpus: int = 0, **kw) -> tuple[Farm, io.StringIO]:
    out = io.StringIO()
    farm = Farm(gpus=gpus, workdir=tmp_path, log_dir="farm-logs",
                console=Console(file=out, width=200), **kw)
    return farm, out


def doc(*steps) -> dict:
    return {"steps": list(steps)}


def test_interpolate_like_pipeline_upload():
    env = {"HOME": "/h", "EMPTY": ""}
    assert interpolate("a $$B ${HOME} $HOME", env) == "a $B /h /h"
    assert interpolate("$${X:-1} ${EMPTY:-dflt} ${MISSING}", env) == "${X:-1} dflt "


def test_retry_on_exit_3_until_success(tmp_path):
    counter = tmp_path / "count"
    flaky = py(f"import pathlib,sys; p=pathlib.Path({str(counter)!r}); "
               f"n=int(p.read_text()) if p.exists() else 0; p.write_text(str(n+1)); "
               f"sys.exit(3 if n < 2 else 0)")
    steps = farm_steps([doc({"key": "flaky", "command": flaky,
                             "retry": {"automatic": [{"exit_status": 3, "limit": 2}]}})])
    farm, _ = make_farm(tmp_path)
    result = farm.run(steps)
    (job,) = result.jobs
    assert (job.state, job.attempts, job.exit_status) == (PASSED, 3, 0)
    assert counter.read_text() == "3"
    assert result.exit_code == 0


def test_retry_limit_exhausted_gives_error_exit(tmp_path):
    steps = farm_steps([doc({"key": "env-broken", "command": py("import sys; sys.exit(3)"),
                             "retry": {"automatic": [{"exit_status": 3, "limit": 1}]}})])
    farm, _ = make_farm(tmp_path)
    result = farm.run(steps)
    assert (result.jobs[0].state, result.jobs[0].attempts) == (FAILED, 2)
    assert result.exit_code == 3   # every hard failure was an environment ERROR


def test_fail_exit_1_is_never_retried(tmp_path):
    counter = tmp_path / "count"
    step = {"key": "fails", "command": f"echo x >> {counter}; exit 1",
            "retry": {"automatic": [{"exit_status": 3, "limit": 2}]}}
    farm, _ = make_farm(tmp_path)
    result = farm.run(farm_steps([doc(step)]))
    assert result.jobs[0].attempts == 1
    assert counter.read_text().count("x") == 1
    assert result.exit_code == 1


def test_soft_fail_on_exit_1_does_not_fail_the_farm(tmp_path):
    steps = farm_steps([doc(
        {"key": "xpass", "command": "exit 1", "soft_fail": [{"exit_status": 1}]},
        {"key": "env", "command": "exit 3", "soft_fail": [{"exit_status": 1}]},
    )])
    farm, _ = make_farm(tmp_path)
    result = farm.run(steps)
    assert [j.state for j in result.jobs] == [SOFT_FAILED, FAILED]   # soft only on exit 1
    assert farm.run(steps[:1]).exit_code == 0


def test_depends_on_orders_and_blocks(tmp_path):
    steps = farm_steps([doc(
        {"group": "g", "key": "grp", "steps": [
            {"key": "first", "command": "sleep 0.2; echo done > first.txt"},
            {"key": "broken", "command": "exit 1"},
        ]},
        {"key": "after-first", "command": "test -f first.txt", "depends_on": "first"},
        {"key": "after-group", "command": "true", "depends_on": ["grp"]},
        {"key": "annotate", "command": "test -f first.txt", "depends_on": ["grp"],
         "allow_dependency_failure": True},
    )])
    farm, _ = make_farm(tmp_path, cpu_slots=2)
    states = {j.step_key: j.state for j in farm.run(steps).jobs}
    assert states == {"first": PASSED, "broken": FAILED, "after-first": PASSED,
                      "after-group": NOT_RUN, "annotate": PASSED}


def test_parallel_jobs_get_buildkite_job_index(tmp_path):
    command = "echo $$BUILDKITE_PARALLEL_JOB/$$BUILDKITE_PARALLEL_JOB_COUNT > shard-$$BUILDKITE_PARALLEL_JOB.txt"
    farm, _ = make_farm(tmp_path)
    result = farm.run(farm_steps([doc({"key": "sharded", "command": command, "parallelism": 3})]))
    assert [j.index for j in result.jobs] == [0, 1, 2]
    assert sorted(p.read_text().strip() for p in tmp_path.glob("shard-*.txt")) == \
        ["0/3", "1/3", "2/3"]


def test_gpu_jobs_get_disjoint_devices_and_oversized_jobs_fail(tmp_path):
    record = "echo $$CUDA_VISIBLE_DEVICES > gpus-$$BUILDKITE_STEP_KEY.txt"
    steps = farm_steps([doc(
        {"key": "a", "command": record, "env": {"PD_ACCURACY_GPUS": "2"}},
        {"key": "b", "command": record, "env": {"PD_ACCURACY_GPUS": "2"}},
        {"key": "huge", "command": "true", "agents": {"queue": "gpu-8"}},
    )])
    assert [s.gpus for s in steps] == [2, 2, 8]
    farm, _ = make_farm(tmp_path, gpus=4)
    states = {j.step_key: j.state for j in farm.run(steps).jobs}
    assert states == {"a": PASSED, "b": PASSED, "huge": FAILED}
    a = set((tmp_path / "gpus-a.txt").read_text().strip().split(","))
    b = set((tmp_path / "gpus-b.txt").read_text().strip().split(","))
    assert len(a) == len(b) == 2 and not a & b


def test_timeout_kills_the_job(tmp_path):
    step = {"key": "slow", "command": "sleep 30", "timeout_in_minutes": 1}
    (farm_step,) = farm_steps([doc(step)])
    farm_step = farm_step.__class__(**{**farm_step.__dict__, "timeout_s": 0.3})
    farm, _ = make_farm(tmp_path)
    (job,) = farm.run([farm_step]).jobs
    assert job.state == TIMED_OUT and job.duration_s < 15


def test_what_a_job_leaves_in_its_process_group_is_stopped(tmp_path):
    step = {"key": "leaves", "command": "sleep 60 & echo $$! > child.pid"}
    farm, _ = make_farm(tmp_path)
    assert farm.run(farm_steps([doc(step)])).exit_code == 0
    child = int((tmp_path / "child.pid").read_text())
    try:
        assert psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        pass


def test_job_env_is_exactly_the_farm_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    step = {"key": "env", "command": 'test -z "$${PYTHONUNBUFFERED+set}"'}
    farm, _ = make_farm(tmp_path, env=env)
    assert farm.run(farm_steps([doc(step)])).exit_code == 0


def test_agent_shim_downloads_nothing_and_writes_annotations(tmp_path):
    command = ('buildkite-agent artifact download "results/**/*" . && '
               'echo hello | buildkite-agent annotate --style success --context pd-accuracy')
    farm, _ = make_farm(tmp_path)
    assert farm.run(farm_steps([doc({"key": "ann", "command": command})])).exit_code == 0
    assert (tmp_path / "farm-logs" / "annotation-pd-accuracy.md").read_text() == "hello\n"


def _fake_pd_accuracy(bin_dir: Path, calls: Path, sleep_s: float = 0.0) -> None:
    """A `pd-accuracy` that logs its argv and fails (exit 1) the runs whose --only list
    contains $FAKE_FAIL (default: p32); a run sleeps `sleep_s` and notes its span in
    spans.txt (monotonic start and end)."""
    script = bin_dir / "pd-accuracy"
    script.write_text(
        f"#!{PY}\n"
        "import json, os, sys, time\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "args = sys.argv[1:]\n"
        "start = time.monotonic()\n"
        f"time.sleep({sleep_s} if args[0] == 'run' else 0)\n"
        f"if args[0] == 'run' and {sleep_s}:\n"
        "    open('spans.txt', 'a').write(f'{start} {time.monotonic()}\\n')\n"
        "if args[0] == 'run' and os.environ.get('FAKE_FAIL', 'p32') in args[args.index('--only') + 1]:\n"
        "    sys.exit(1)\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_farm_runs_the_generated_pipeline_commands_verbatim(tmp_path):
    calls = tmp_path / "calls.jsonl"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_pd_accuracy(bin_dir, calls)
    cells = [Cell(model="tiny", decode_block_size=d, prefill_block_size=p)
             for d in (16, 32) for p in (16, 128)]
    cells.append(Cell(model="tiny", decode_block_size=16, prefill_block_size=32))
    cells.append(Cell(model="tiny", decode_block_size=32, prefill_block_size=32,
                      expected_failure="known upstream bug"))
    docs = generate_pipeline(cells, profile="smoke")
    steps = farm_steps(docs)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    farm, _ = make_farm(tmp_path, env=env)
    result = farm.run(steps)

    import json
    argvs = [json.loads(line) for line in calls.read_text().splitlines()]
    run_only = sorted(a[a.index("--only") + 1] for a in argvs if a[0] == "run")
    # every command of the pipeline ran once, with exactly its argv
    commands = [shlex.split(s.commands[0]) for s in steps if s.key != ANNOTATE_KEY]
    expected = sorted(argv[argv.index("--only") + 1] for argv in commands)
    assert run_only == expected
    assert argvs[-1][0] == "annotate"      # ran last, after every cell step
    states = {j.step_key: j.state for j in result.jobs}
    assert states[ANNOTATE_KEY] == PASSED
    xfail_key = next(s.key for s in steps if s.key.endswith("-xfail"))
    assert states[xfail_key] == SOFT_FAILED    # its only cell is p32: exit 1, soft
    # the p32d16 regular cell shares the d16 baseline step, which therefore fails hard
    assert FAILED in states.values()
    assert result.exit_code == 1


def test_run_farm_smoke_profile_with_fake_run_command(tmp_path, monkeypatch):
    """`farm --profile smoke` end to end, with `pd-accuracy` faked (no vLLM)."""
    from harness import matrix
    from harness.cli.main import main

    calls = tmp_path / "calls.jsonl"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_pd_accuracy(bin_dir, calls)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("BUILDKITE", raising=False)
    monkeypatch.setenv("FAKE_FAIL", "no-cell-has-this")
    monkeypatch.chdir(tmp_path)
    assert main(["farm", "--profile", "smoke", "--gpus", "0", "--limit", "3",
                 "--log-dir", "logs"]) == 0

    import json
    argvs = [json.loads(line) for line in calls.read_text().splitlines()]
    runs = [a for a in argvs if a[0] == "run"]
    from harness.core.platform import PlatformInfo

    cells = matrix.expand(matrix.load_matrix(), "smoke", PlatformInfo.detect()).cells
    ran = sorted(i for a in runs for i in a[a.index("--only") + 1].split(","))
    assert ran == sorted(c.cell_id for c in cells)
    # one run per baseline; expected-failure cells get their own (soft-fail) step
    assert len(runs) == len({(c.baseline_key, bool(c.expected_failure)) for c in cells})
    assert all(a[a.index("--limit") + 1] == "3" for a in runs)
    assert argvs[-1][:1] == ["annotate"]
    assert len(list((tmp_path / "logs").glob("*.log"))) == len(runs) + 1


def test_cli_farm_refuses_the_old_local_flag_and_an_unknown_profile(tmp_path, monkeypatch, capsys):
    from harness.cli.main import main

    monkeypatch.chdir(tmp_path)
    assert main(["farm", "--local", "--profile", "smoke"]) == 2   # here is the only mode: no flag
    assert main(["farm", "--profile", "nosuch"]) == 2
    assert main(["farm", "--profile", "smoke", "--dry-run"]) == 0
    assert "pd-accuracy run --profile smoke" in capsys.readouterr().out


def test_one_group_gpu_steps_share_a_gpu_by_memory(tmp_path):
    """Three one-group steps on one GPU: two fit its memory together, the third waits for one of
    them; a job of unknown size (a shard) waits for the GPU to be empty."""
    # each job notes when it started and ended, then sleeps: overlaps show in the times
    note = ("import os, time, pathlib; k = os.environ['BUILDKITE_STEP_KEY']; "
            "p = pathlib.Path(f'span-{k}.txt'); s = time.monotonic(); time.sleep(0.8); "
            "p.write_text(f'{s} {time.monotonic()} {os.environ[\"CUDA_VISIBLE_DEVICES\"]}')")
    gpu = {"PD_ACCURACY_GPUS": "1"}
    steps = farm_steps([doc(*({"key": k, "command": py(note), "env": gpu}
                              for k in ("g1", "g2", "g3", "shard")))])
    gib = 1 << 30
    farm, _ = make_farm(tmp_path, gpus=1, gpu_bytes=[100 * gib], max_gpu_jobs=8,
                        step_peak_bytes={"g1": 40 * gib, "g2": 40 * gib, "g3": 40 * gib})
    assert {j.state for j in farm.run(steps).jobs} == {PASSED}
    span = {k: [float(x) for x in (tmp_path / f"span-{k}.txt").read_text().split()[:2]]
            for k in ("g1", "g2", "g3", "shard")}
    assert span["g2"][0] < span["g1"][1] and span["g1"][0] < span["g2"][1]   # together
    assert span["g3"][0] >= min(span["g1"][1], span["g2"][1]) - 0.05      # after one ended
    others = [v for k, v in span.items() if k != "shard"]
    assert all(span["shard"][0] >= end - 0.05 or span["shard"][1] <= start + 0.05
               for start, end in others)                                   # alone


def test_farm_runs_the_pr_profile_on_one_gpu_with_groups_side_by_side(tmp_path, monkeypatch):
    """`farm --gpus 1 --profile pr` on a (pretended) one-H200 machine, `pd-accuracy`
    faked: every pr cell runs, every GPU step on GPU 0, and several at once."""
    import json

    from harness import matrix
    from harness.ci import farm as farm_module
    from harness.cli.main import main
    from harness.core import platform

    h200 = [platform.GpuDevice(0, "NVIDIA H200", 141 << 30)]
    monkeypatch.setattr(platform, "detect_gpus", lambda: h200)
    monkeypatch.setattr(farm_module, "detect_gpus", lambda: h200)
    monkeypatch.setattr(platform, "query_gpu_used_bytes", lambda: {})
    monkeypatch.setattr(platform, "netns_unavailable_reason", lambda: None)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    calls = tmp_path / "calls.jsonl"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_pd_accuracy(bin_dir, calls, sleep_s=0.4)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("BUILDKITE", raising=False)
    monkeypatch.setenv("FAKE_FAIL", "no-cell-has-this")
    monkeypatch.chdir(tmp_path)
    assert main(["farm", "--profile", "pr", "--gpus", "1", "--log-dir", "logs"]) == 0
    runs = [a for a in map(json.loads, calls.read_text().splitlines()) if a[0] == "run"]
    cells = matrix.expand(matrix.load_matrix(), "pr", platform.PlatformInfo.from_devices(h200)).cells
    assert len(cells) == 32
    assert sorted(i for a in runs for i in a[a.index("--only") + 1].split(",")) == \
        sorted(c.cell_id for c in cells)
    log = "\n".join(p.read_text() for p in (tmp_path / "logs").glob("*.log"))
    assert "needs 2 GPUs" not in log
    spans = sorted((float(s), float(e)) for s, e in
                   (line.split() for line in (tmp_path / "spans.txt").read_text().splitlines()))
    assert max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans) > 1   # side by side
