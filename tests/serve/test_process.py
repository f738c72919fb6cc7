"""ManagedProcess: health waiting, fail-fast death, timeouts, group teardown, signals, PDEATHSIG."""
from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from harness.serve.supervision import process as process_mod
from harness.serve.host.ports import PortAllocator
from harness.serve.supervision.process import (
    ManagedProcess,
    ProcessStartError,
    ServerDiedError,
    ServerStartTimeout,
    decisive_error_lines,
    live_processes,
    most_decisive_line,
    process_group_alive,
    stop_all,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def write_script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def gone(pid: int) -> bool:
    """True when pid no longer runs (a zombie nobody reaped yet counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(predicate, timeout_s: float = 5.0, interval_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def wait_for_log(proc: ManagedProcess, pattern: str, timeout_s: float = 5.0) -> re.Match[str]:
    found: list[re.Match[str]] = []

    def check() -> bool:
        match = re.search(pattern, proc.read_log())
        if match:
            found.append(match)
        return bool(match)

    assert wait_until(check, timeout_s), f"{pattern!r} not in log:\n{proc.read_log()}"
    return found[0]


@pytest.fixture
def port(tmp_path: Path) -> int:
    allocator = PortAllocator(lock_dir=tmp_path / "ports")
    return allocator.reserve(1, owner="test_process")[0]


@pytest.fixture(autouse=True)
def no_leftovers():
    """Every test must leave no live ManagedProcess behind; stop them anyway if one failed."""
    before = set(map(id, live_processes()))
    yield
    leftovers = [p for p in live_processes() if id(p) not in before]
    for p in leftovers:
        p.kill()
    assert not leftovers, f"test left processes running: {leftovers}"


HEALTH_SERVER = """
    import sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    port, delay = int(sys.argv[1]), float(sys.argv[2])
    ready_at = time.monotonic() + delay
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            healthy = self.path == "/health" and time.monotonic() >= ready_at
            self.send_response(200 if healthy else 503)
            self.end_headers()
        def log_message(self, *args):
            pass
    server = HTTPServer(("127.0.0.1", port), Handler)
    print("listening on", port, flush=True)
    server.serve_forever()
"""


def test_wait_healthy_returns_once_health_answers_200(tmp_path, port):
    script = write_script(tmp_path, "server.py", HEALTH_SERVER)
    delay_s = 0.6
    with ManagedProcess("toy-server", [PY, script, port, delay_s], tmp_path / "server.log") as proc:
        started = time.monotonic()
        proc.wait_healthy(f"http://127.0.0.1:{port}/health", deadline_s=20, poll_s=0.05)
        waited = time.monotonic() - started
        assert proc.is_running()
        # 503 answers before the delay must not count as healthy
        assert waited >= delay_s - 0.25
        assert proc in live_processes()
    assert not proc.is_running()
    assert proc.returncode == -signal.SIGTERM
    assert proc not in live_processes()
    log = (tmp_path / "server.log").read_text()
    assert f"start toy-server: {PY}" in log and f"listening on {port}" in log


def test_server_that_exits_with_error_fails_fast(tmp_path, port):
    script = write_script(tmp_path, "crash.py", """
        import time
        print("INFO 11-29 19:22:01 [nixl_connector.py:1] Initializing NIXL wrapper", flush=True)
        time.sleep(0.2)
        raise ValueError("max_model_len 99999 exceeds the model's 2048")
    """)
    proc = ManagedProcess("decode-0", [PY, script], tmp_path / "decode-0.log").start()
    started = time.monotonic()
    with pytest.raises(ServerDiedError) as info:
        proc.wait_healthy(f"http://127.0.0.1:{port}/health", deadline_s=30, poll_s=0.05)
    assert time.monotonic() - started < 5, "must not wait for the 30 s deadline"
    err = info.value
    assert err.returncode == 1 and err.name == "decode-0"
    assert err.decisive_lines[-1] == "ValueError: max_model_len 99999 exceeds the model's 2048"
    assert not any("Initializing NIXL" in line for line in err.decisive_lines)
    assert str(err) == (
        "decode-0 exited with code 1 before becoming healthy: "
        f"ValueError: max_model_len 99999 exceeds the model's 2048 (log: {tmp_path / 'decode-0.log'})")
    assert "\n" not in str(err)
    # picklable (pytest-xdist, multiprocessing) with its fields intact
    clone = pickle.loads(pickle.dumps(err))
    assert str(clone) == str(err) and clone.returncode == 1
    assert proc.stop() == 1  # stopping a dead process is fine
    assert proc not in live_processes()


def test_exit_code_zero_before_healthy_is_also_death(tmp_path, port):
    proc = ManagedProcess("quitter", [PY, "-c", "print('nothing to serve')"], tmp_path / "q.log")
    with proc:
        with pytest.raises(ServerDiedError, match=r"^quitter exited with code 0 before becoming "
                                                  r"healthy: nothing to serve \(log: "):
            proc.wait_healthy(f"http://127.0.0.1:{port}/health", deadline_s=30, poll_s=0.05)


def test_killed_by_signal_names_the_signal(tmp_path, port):
    script = "import os, signal; print('oom soon', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    with ManagedProcess("prefill-0", [PY, "-c", script], tmp_path / "p.log") as proc:
        with pytest.raises(ServerDiedError, match=r"exited with code -9 \(SIGKILL\)"):
            proc.wait_healthy(f"http://127.0.0.1:{port}/health", deadline_s=30, poll_s=0.05)


def test_never_healthy_times_out_and_keeps_running(tmp_path, port):
    script = "import time; print('loading weights', flush=True); time.sleep(300)"
    with ManagedProcess("slow", [PY, "-c", script], tmp_path / "slow.log") as proc:
        wait_for_log(proc, "loading weights")
        started = time.monotonic()
        with pytest.raises(ServerStartTimeout) as info:
            proc.wait_healthy(f"http://127.0.0.1:{port}/health", deadline_s=0.6, poll_s=0.05)
        elapsed = time.monotonic() - started
        assert 0.55 <= elapsed < 3
        assert info.value.decisive_lines == ["loading weights"]  # fallback: the log's last lines
        assert str(info.value).startswith("slow was not healthy after 0.6s: loading weights (log: ")
        assert proc.is_running(), "a timeout leaves the process for the caller to inspect"


def test_log_is_appended_and_only_this_run_is_read(tmp_path, port):
    log_path = tmp_path / "shared.log"
    for message in ("first failure", "second failure"):
        proc = ManagedProcess("again", [PY, "-c", f"raise RuntimeError({message!r})"], log_path)
        with proc, pytest.raises(ServerDiedError) as info:
            proc.wait_healthy(f"http://127.0.0.1:{port}/health", deadline_s=30, poll_s=0.05)
    assert info.value.decisive_line == "RuntimeError: second failure"
    assert not any("first" in line for line in info.value.decisive_lines)
    log = log_path.read_text()
    assert "RuntimeError: first failure" in log and log.count("start again:") == 2


def test_missing_executable_raises_process_start_error(tmp_path):
    proc = ManagedProcess("ghost", ["/nonexistent/vllm", "serve"], tmp_path / "ghost.log")
    with pytest.raises(ProcessStartError, match=r"^ghost could not be started: .*No such file"):
        proc.start()
    assert proc not in live_processes()
    assert "could not start ghost" in (tmp_path / "ghost.log").read_text()


def test_env_overrides_and_removals(tmp_path, monkeypatch):
    monkeypatch.setenv("PD_TEST_REMOVE_ME", "x")
    monkeypatch.setenv("PD_TEST_KEEP", "kept")
    proc = ManagedProcess("env", [PY, "-c", "pass"], tmp_path / "env.log",
                          env={"PD_TEST_REMOVE_ME": None, "VLLM_NIXL_SIDE_CHANNEL_PORT": "21000"})
    env = proc.build_env()
    assert "PD_TEST_REMOVE_ME" not in env
    assert env["PD_TEST_KEEP"] == "kept" and env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "21000"
    assert env["PYTHONUNBUFFERED"] == "1"
    isolated = ManagedProcess("env", [PY], tmp_path / "env.log", env={"A": "1"}, inherit_env=False)
    assert isolated.build_env() == {"A": "1", "PYTHONUNBUFFERED": "1"}
    # and the child really gets it, in its cwd
    script = "import os; print(os.environ['VLLM_NIXL_SIDE_CHANNEL_PORT'], os.getcwd())"
    runner = ManagedProcess("env", [PY, "-c", script], tmp_path / "env.log",
                            env={"VLLM_NIXL_SIDE_CHANNEL_PORT": "21000"}, cwd=tmp_path)
    with runner:
        wait_for_log(runner, f"21000 {re.escape(str(tmp_path))}")


SIGTERM_IGNORING_PARENT = """
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # inherited by the grandchild through exec
    child = subprocess.Popen(["sleep", "300"])
    print("grandchild", child.pid, flush=True)
    time.sleep(300)
"""


def test_stop_kills_whole_group_when_sigterm_is_ignored(tmp_path):
    script = write_script(tmp_path, "stubborn.py", SIGTERM_IGNORING_PARENT)
    proc = ManagedProcess("stubborn", [PY, script], tmp_path / "stubborn.log").start()
    grandchild = int(wait_for_log(proc, r"grandchild (\d+)").group(1))
    leader = proc.pid
    assert os.getpgid(grandchild) == proc.pgid == leader
    started = time.monotonic()
    assert proc.stop(term_timeout_s=0.5) == -signal.SIGKILL
    assert 0.45 <= time.monotonic() - started < 5
    assert gone(leader) and gone(grandchild)
    assert not process_group_alive(leader)
    assert proc.stop() == -signal.SIGKILL  # idempotent


def test_stop_kills_sigterm_ignoring_member_after_leader_exits(tmp_path):
    # The leader obeys SIGTERM at once; a group member ignoring it must still be SIGKILLed.
    script = write_script(tmp_path, "leader.py", """
        import subprocess, sys, time
        stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                    "print('ignoring', flush=True); time.sleep(300)")
        child = subprocess.Popen([sys.executable, "-c", stubborn])
        print("grandchild", child.pid, flush=True)
        time.sleep(300)
    """)
    with ManagedProcess("leader", [PY, script], tmp_path / "leader.log") as proc:
        grandchild = int(wait_for_log(proc, r"grandchild (\d+)").group(1))
        wait_for_log(proc, "ignoring")
        assert proc.stop(term_timeout_s=0.5) == -signal.SIGTERM
    assert gone(grandchild)


def test_stop_reaches_descendant_that_left_the_group(tmp_path):
    script = write_script(tmp_path, "escapee.py", """
        import subprocess, time
        child = subprocess.Popen(["sleep", "300"], start_new_session=True)
        print("escapee", child.pid, flush=True)
        time.sleep(300)
    """)
    with ManagedProcess("escaper", [PY, script], tmp_path / "escaper.log") as proc:
        escapee = int(wait_for_log(proc, r"escapee (\d+)").group(1))
        assert os.getpgid(escapee) != proc.pgid
    assert wait_until(lambda: gone(escapee), 3)


def test_concurrent_stop_from_two_threads_waits_instead_of_escalating(tmp_path):
    proc = ManagedProcess("shared", ["sleep", "300"], tmp_path / "s.log").start()
    codes: list[int | None] = []
    threads = [threading.Thread(target=lambda: codes.append(proc.stop())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert codes == [-signal.SIGTERM, -signal.SIGTERM]


def test_stop_all_stops_every_registered_process(tmp_path):
    first = ManagedProcess("a", ["sleep", "300"], tmp_path / "a.log").start()
    second = ManagedProcess("b", [PY, "-c", "import time; time.sleep(300)"], tmp_path / "b.log").start()
    assert {first, second} <= set(live_processes())
    started = time.monotonic()
    stop_all(term_timeout_s=5)
    assert time.monotonic() - started < 3  # both obey SIGTERM: no waiting for the timeout
    assert not first.is_running() and not second.is_running()
    assert first not in live_processes() and second not in live_processes()
    assert gone(first.pid) and gone(second.pid)


def test_started_from_short_lived_thread_survives_thread_exit(tmp_path):
    # PDEATHSIG fires when the forking *thread* exits; the spawner thread must prevent that.
    holder: list[ManagedProcess] = []
    worker = threading.Thread(target=lambda: holder.append(
        ManagedProcess("threaded", ["sleep", "300"], tmp_path / "t.log").start()))
    worker.start()
    worker.join()
    proc = holder[0]
    time.sleep(0.3)
    try:
        assert proc.is_running(), f"child died with {proc.returncode} when its thread exited"
    finally:
        proc.stop()


def test_rss_sums_the_process_tree(tmp_path):
    script = write_script(tmp_path, "hog.py", """
        import subprocess, sys, time
        hog = "b = bytearray(60 * 2**20); print('child ready', flush=True); import time; time.sleep(300)"
        child = subprocess.Popen([sys.executable, "-c", hog])
        mine = bytearray(60 * 2**20)
        print("parent ready", flush=True)
        time.sleep(300)
    """)
    with ManagedProcess("hog", [PY, script], tmp_path / "hog.log") as proc:
        wait_for_log(proc, "parent ready")
        wait_for_log(proc, "child ready")
        rss = proc.rss_bytes()
        leader_rss = psutil.Process(proc.pid).memory_info().rss
        assert rss >= 120 * 2**20 and rss > leader_rss + 60 * 2**20
        assert proc.peak_rss_bytes() >= rss * 0.95
        assert process_mod.total_rss_bytes([proc]) == pytest.approx(rss, rel=0.1)
        assert process_mod.peak_rss_bytes([proc]) >= 120 * 2**20
    assert proc.rss_bytes() == 0


DRIVER = """
    import json, sys, time
    from harness.serve.supervision.process import ManagedProcess, install_signal_handlers
    log_dir, term_timeout_s, b_ignores_sigterm = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
    install_signal_handlers(term_timeout_s=term_timeout_s)
    a = ManagedProcess("a", ["sleep", "300"], log_dir + "/a.log").start()
    b_code = "import time; time.sleep(300)"
    if b_ignores_sigterm:
        b_code = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " + b_code
    b = ManagedProcess("b", [sys.executable, "-c", b_code], log_dir + "/b.log").start()
    if b_ignores_sigterm:
        while "ready" not in b.read_log():
            time.sleep(0.01)
    try:
        print(json.dumps([a.pid, b.pid]), flush=True)
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        print("KeyboardInterrupt raised; children running:", a.is_running() or b.is_running(),
              flush=True)
        raise
"""


def start_driver(tmp_path: Path, term_timeout_s: float = 2, b_ignores_sigterm: bool = False
                 ) -> tuple[subprocess.Popen[str], list[int]]:
    script = write_script(tmp_path, "driver.py", DRIVER)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    argv = [PY, str(script), str(tmp_path), str(term_timeout_s), "1" if b_ignores_sigterm else "0"]
    driver = subprocess.Popen(argv, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    line = driver.stdout.readline()
    assert line, f"driver printed nothing: {driver.stderr.read()}"
    children = json.loads(line)
    assert all(psutil.pid_exists(pid) for pid in children)
    return driver, children


def finish(driver: subprocess.Popen[str], children: list[int]) -> tuple[str, str]:
    try:
        return driver.communicate(timeout=15)
    finally:
        if driver.poll() is None:
            driver.kill()
        for pid in children:  # never leave servers behind, even if the assertion fails
            if not gone(pid):
                os.killpg(pid, signal.SIGKILL)


def test_ctrl_c_stops_children_then_raises_keyboard_interrupt(tmp_path):
    driver, children = start_driver(tmp_path)
    driver.send_signal(signal.SIGINT)
    out, err = finish(driver, children)
    assert "KeyboardInterrupt raised; children running: False" in out, err
    assert driver.returncode != 0
    assert all(gone(pid) for pid in children)


def test_second_ctrl_c_escalates_to_sigkill(tmp_path):
    # b ignores SIGTERM and the grace period is 60 s: only the second Ctrl-C makes it quick.
    driver, children = start_driver(tmp_path, term_timeout_s=60, b_ignores_sigterm=True)
    started = time.monotonic()
    driver.send_signal(signal.SIGINT)
    assert wait_until(lambda: gone(children[0]), 5), "first Ctrl-C sends SIGTERM to every group"
    assert not gone(children[1])
    driver.send_signal(signal.SIGINT)
    out, err = finish(driver, children)
    assert time.monotonic() - started < 10
    assert "KeyboardInterrupt raised; children running: False" in out, err
    assert all(gone(pid) for pid in children)


def test_sigterm_stops_children_and_exits(tmp_path):
    driver, children = start_driver(tmp_path)
    driver.send_signal(signal.SIGTERM)
    out, err = finish(driver, children)
    assert driver.returncode == 128 + signal.SIGTERM, err
    assert "KeyboardInterrupt" not in out
    assert all(gone(pid) for pid in children)


def test_pdeathsig_takes_down_child_when_driver_is_sigkilled(tmp_path):
    driver, children = start_driver(tmp_path)
    driver.kill()  # SIGKILL: no handler, no atexit; only the kernel's parent-death signal is left
    try:
        driver.wait(timeout=5)
        assert wait_until(lambda: all(gone(pid) for pid in children), 5)
    finally:
        finish(driver, children)


# --- decisive lines ------------------------------------------------------------------------

VLLM_LOG = """\
INFO 11-29 19:22:01 [api_server.py:100] vLLM API server version 0.32.0
INFO 11-29 19:22:02 [nixl_connector.py:77] Initializing NIXL wrapper
(EngineCore_DP0 pid=4242) INFO 11-29 19:22:03 [core.py:1] error_rate metric enabled
(EngineCore_DP0 pid=4242) ERROR 11-29 19:22:05 [core.py:700] EngineCore failed to start.
(EngineCore_DP0 pid=4242) Traceback (most recent call last):
(EngineCore_DP0 pid=4242)   File "/vllm/v1/engine/core.py", line 690, in run_engine_core
(EngineCore_DP0 pid=4242)     engine_core = EngineCoreProc(*args, **kwargs)
(EngineCore_DP0 pid=4242) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
Traceback (most recent call last):
  File "/vllm/entrypoints/openai/api_server.py", line 1, in <module>
    main()
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_decisive_lines_of_a_vllm_crash():
    lines = decisive_error_lines(VLLM_LOG)
    assert lines == [
        "(EngineCore_DP0 pid=4242) ERROR 11-29 19:22:05 [core.py:700] EngineCore failed to start.",
        "(EngineCore_DP0 pid=4242) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ]
    # the generic wrapper points elsewhere: the root cause is the most decisive line
    assert most_decisive_line(lines).endswith("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert decisive_error_lines(VLLM_LOG, limit=1) == [lines[-1]]


TP_WORKER_CRASH_LOG = """\
(Worker_TP0 pid=30313) INFO 11-30 02:26:05 [flashinfer_all_reduce.py:121] Auto-selected flashinfer allreduce backend: mnnvl
(Worker_TP1 pid=30314) ERROR 11-30 02:26:16 [multiproc_executor.py:1007] WorkerProc hit an exception.
(Worker_TP1 pid=30314) ERROR 11-30 02:26:16 [multiproc_executor.py:1007] Traceback (most recent call last):
(Worker_TP1 pid=30314) ERROR 11-30 02:26:16 [multiproc_executor.py:1007]   File "/tmp/site/vllm/v1/worker/gpu_worker.py", line 465, in determine_available_memory
(Worker_TP1 pid=30314) ERROR 11-30 02:26:16 [multiproc_executor.py:1007] RuntimeError: CUDA error: CUBLAS_STATUS_INTERNAL_ERROR when calling `cublasCreate(handle)`
(EngineCore pid=29636) ERROR 11-30 02:26:16 [core.py:1330] EngineCore failed to start.
(EngineCore pid=29636) ERROR 11-30 02:26:16 [core.py:1330] RuntimeError: Worker failed with error 'CUDA error: CUBLAS_STATUS_INTERNAL_ERROR when calling `cublasCreate(handle)`', please check the stack trace above for the root cause
(Worker_TP1 pid=30314) SystemExit
(Worker_TP1 pid=30314) torch.AcceleratorError: CUDA error: an illegal memory access was encountered
(Worker_TP1 pid=30314) Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.
(Worker_TP1 pid=30314) CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
(Worker_TP1 pid=30314) For debugging consider passing CUDA_LAUNCH_BLOCKING=1
(Worker_TP1 pid=30314) Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
terminate called after throwing an instance of 'c10::AcceleratorError'
  what():  CUDA error: an illegal memory access was encountered
Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.
Exception raised from ~AllocationRef at /pytorch/torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemory.cu:51 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::__cxx11::basic_string<char>) + 0x9d (0x7fd4ae17305d in libc10.so)
"""


def test_a_tp_workers_cause_beats_the_abort_trailer_of_its_teardown():
    # the H200's TP2 start-up crash (2026-11-30): the reason named "Exception raised from
    # ~AllocationRef", a destructor in the teardown, instead of the CUBLAS failure
    lines = decisive_error_lines(TP_WORKER_CRASH_LOG)
    assert not any("~AllocationRef" in line or "terminate called" in line or "what():" in line
                   for line in lines)
    assert any("Worker failed with error" in line for line in lines)
    assert "Worker failed with error 'CUDA error: CUBLAS_STATUS_INTERNAL_ERROR" in \
        most_decisive_line(lines)


def test_a_start_up_timeout_with_only_harmless_warnings_shows_where_the_server_was():
    # H200, 2026-11-30: an overloaded Granite baseline timed out in CUDA-graph capture and the
    # reason named a harmless nixl_ep import warning (a traceback inside a WARNING record)
    log = "\n".join([
        "(APIServer pid=4079) WARNING 11-30 05:30:23 [system_utils.py:299] Found ulimit of 20000 and "
        "failed to automatically increase with error current limit exceeds maximum limit.",
        "(EngineCore pid=1) WARNING 11-30 05:32:44 [import_utils.py:408] Module nixl_ep was found but "
        "failed to import",
        "(EngineCore pid=1) WARNING 11-30 05:32:44 [import_utils.py:408] Traceback (most recent call last):",
        '(EngineCore pid=1) WARNING 11-30 05:32:44 [import_utils.py:408]   File "<frozen importlib>", line 1',
        "(EngineCore pid=1) WARNING 11-30 05:32:44 [import_utils.py:408] ModuleNotFoundError: No module "
        "named 'nixl_ep_cu13.nixl_ep_cpp_torch211'",
        "(EngineCore pid=1) WARNING 11-30 05:32:50 [flashinfer.py:369] Failed to connect to NVIDIA "
        "artifactory: HTTPSConnectionPool(host='edge.urm.nvidia.com', port=443)",
        "(EngineCore pid=1) INFO 11-30 05:36:36 [gpu_model_runner.py:6798] Rank 0: Torch profiler "
        "disabled for CUDA graph capture",
    ])
    assert most_decisive_line(decisive_error_lines(log)).endswith(
        "Torch profiler disabled for CUDA graph capture")


def test_decisive_lines_argparse_nixl_warning_dedupe_and_fallback():
    log = "\n".join([
        "usage: vllm serve [-h] ...",
        "vllm serve: error: unrecognized arguments: --kv-tranfer-config",
    ])
    assert decisive_error_lines(log) == ["vllm serve: error: unrecognized arguments: --kv-tranfer-config"]
    nixl = "\n".join([
        "(EngineCore_DP0 pid=1) WARNING 11-29 [nixl.py:1] NIXL_ERR_BACKEND: UCX transport failed",
        "(EngineCore_DP0 pid=2) WARNING 11-29 [nixl.py:1] NIXL_ERR_BACKEND: UCX transport failed",
        "INFO 11-29 [nixl.py:2] NIXL agent shut down",
    ])
    assert decisive_error_lines(nixl) == [
        "(EngineCore_DP0 pid=2) WARNING 11-29 [nixl.py:1] NIXL_ERR_BACKEND: UCX transport failed"]
    routine = "\n".join([
        "2026-11-29 19:22:01 NIXL INFO    _api.py:361 Backend UCX was instantiated",
        "I1129 19:22:01.123456  4242 nixl_agent.cpp:88] NIXL agent created",
        "E1129 19:22:02.000001  4242 ucx_backend.cpp:12] ucp_ep_create failed: Destination is unreachable",
        "2026-11-29 19:22:03 NIXL INFO    _api.py:400 Shutting down",
    ])
    assert decisive_error_lines(routine) == [
        "E1129 19:22:02.000001  4242 ucx_backend.cpp:12] ucp_ep_create failed: Destination is unreachable"]
    plain = "\n".join(f"step {i}" for i in range(30)) + "\n\n"
    assert decisive_error_lines(plain) == [f"step {i}" for i in range(20, 30)]
    assert decisive_error_lines("") == [] and most_decisive_line([]) == ""
    many = "\n".join(f"ValueError: bad value {i}" for i in range(9))
    assert decisive_error_lines(many) == [f"ValueError: bad value {i}" for i in range(4, 9)]


def test_known_harmless_nixl_ep_warning_is_never_decisive():
    log = "\n".join([
        "(EngineCore pid=1) WARNING 11-30 02:21:33 [import_utils.py:408] ModuleNotFoundError: "
        "No module named 'nixl_ep_cu13.nixl_ep_cpp_torch211'",
        "(EngineCore pid=2) ERROR 11-30 02:22:38 [core.py:1332] RuntimeError: shape "
        "'[-1, 4, 64, 0, 128]' is invalid for input of size 131072",
    ])
    lines = decisive_error_lines(log)
    assert len(lines) == 1 and "is invalid for input of size" in lines[0]
    only_harmless = log.splitlines()[0]
    assert all("nixl_ep" in l for l in decisive_error_lines(only_harmless))  # fallback: last lines


def test_a_refused_nixl_handshake_is_the_decisive_line_over_what_follows_it():
    """vLLM 0.26 on the H200 (2026-12-03): after the hash mismatch each request raised an IndexError."""
    lines = ["(EngineCore pid=1) RuntimeError: NIXL compatibility hash mismatch. Local: a, Remote: b.",
             "(EngineCore pid=1) IndexError: list index out of range"]
    assert "compatibility hash mismatch" in most_decisive_line(lines)
